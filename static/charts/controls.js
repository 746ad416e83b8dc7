// The controls of the chart view: the toolbar above the charts (the whole page) and each chart's own row of tools
// (pin, PNG, CSV) and its menu (its own smoothing, log y, x axis and outliers, over the page's). Built here rather
// than in the page's template so that any page that shows a ChartGrid gets the same controls.
import { MAX_SMOOTHING } from "./view.js";

const X_LABELS = { step: "Step", wall: "Wall time", rel: "Since start" };
const RANK_LABELS = { all: "All ranks", rank0: "Rank 0", mean: "Mean, min–max" };

/** An element with properties and children: el("label", {className: "x"}, "text", child). */
export function el(tag, { aria, role, ...props } = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  if (aria) node.setAttribute("aria-label", aria);  // attributes: not every browser reflects them as properties
  if (role) node.setAttribute("role", role);
  node.append(...children);
  return node;
}

function select(name, labels, label) {
  const options = Object.entries(labels).map(([value, text]) => new Option(text, value));
  return el("select", { name, title: label, aria: label }, ...options);
}

/** Smoothing, log y, x axis and outliers, reading `get()` and writing `set(patch)`; `sync()` shows `get()` again. */
export function settingControls(get, set) {
  const slider = el("input", { type: "range", name: "smoothing", min: "0", max: String(MAX_SMOOTHING), step: "0.01" });
  const shown = el("output", { className: "smoothing-value" });
  const log = el("input", { type: "checkbox", name: "logy" });
  const x = select("x", X_LABELS, "X axis");
  const outliers = el("input", { type: "checkbox", name: "outliers" });
  slider.addEventListener("input", () => {
    shown.value = Number(slider.value).toFixed(2);
    set({ smoothing: Number(slider.value) });
  });
  log.addEventListener("change", () => set({ logY: log.checked }));
  x.addEventListener("change", () => set({ x: x.value }));
  outliers.addEventListener("change", () => set({ outliers: outliers.checked }));
  const sync = () => {
    const view = get();
    if (document.activeElement !== slider) slider.value = String(view.smoothing);
    shown.value = Number(view.smoothing).toFixed(2);
    log.checked = view.logY;
    x.value = view.x;
    outliers.checked = view.outliers;
  };
  sync();
  const elements = [
    el("label", { title: "TensorBoard's debiased exponential moving average; the raw line stays faint behind" },
       "Smoothing ", slider, " ", shown),
    el("label", { title: "Values at or below zero are left out of a log scale" }, log, " Log y"),
    el("label", {}, "X ", x),
    el("label", { title: "Fit the y axis to the 1st–99th percentile of the points in view" },
       outliers, " Ignore outliers"),
  ];
  return { elements, sync };
}

/** The page-wide toolbar in `container`: filter, the settings, rank mode, reset. Returns {sync, count(shown, all)}. */
export function toolbar(container, store) {
  const filter = el("input", { type: "search", name: "filter", placeholder: "Filter: regex or text",
                               aria: "Filter charts by key or title (a regular expression, or plain text)" });
  const count = el("span", { className: "chart-count hint" });
  const ranks = select("ranks", RANK_LABELS, "Ranks: each rank's line, rank 0's, or their mean with a min–max band");
  const reset = el("button", { type: "button", className: "link", textContent: "Reset view" });
  const settings = settingControls(() => store.view, (patch) => store.update(patch));
  filter.addEventListener("input", () => store.update({ filter: filter.value }));
  ranks.addEventListener("change", () => store.update({ ranks: ranks.value }));
  reset.addEventListener("click", () => store.reset());
  container.replaceChildren(el("label", { className: "chart-filter" }, filter), count, ...settings.elements,
                            el("label", {}, "Ranks ", ranks), reset);
  const sync = () => {
    settings.sync();
    if (document.activeElement !== filter) filter.value = store.view.filter;
    ranks.value = store.view.ranks;
  };
  sync();
  store.subscribe(sync);
  return {
    sync,
    count(shown, all) {
      container.hidden = all === 0;  // a run with no metrics yet has nothing to view
      count.textContent = shown === all ? `${all} chart${all === 1 ? "" : "s"}` : `${shown} of ${all} charts`;
    },
  };
}

let menusClose = false;

/** An open chart menu closes when the user clicks anywhere else, as menus do (a <details> alone stays open). */
function closeMenusOnClickAway() {
  if (menusClose) return;
  menusClose = true;
  document.addEventListener("click", (event) => {
    for (const menu of document.querySelectorAll("details.chart-menu[open]")) {
      if (!menu.contains(event.target)) menu.open = false;
    }
  });
}

/** A chart's tools in its caption: pin, PNG, CSV and its own view menu. `actions` has pin(), png(), csv(). */
export function chartTools(figure, title, store, id, actions) {
  closeMenusOnClickAway();
  const pin = el("button", { type: "button", className: "chart-pin", textContent: "☆",
                             title: "Pin to the top of the page", aria: `Pin ${title}` });
  pin.setAttribute("aria-pressed", "false");
  const png = el("button", { type: "button", className: "chart-png", textContent: "PNG", title: "Download as PNG" });
  const csv = el("button", { type: "button", className: "chart-csv", textContent: "CSV",
                             title: "Download the points in view as CSV: every point of every rank" });
  const menu = el("details", { className: "chart-menu" }, el("summary", { title: "This chart's own view" }, "View"));
  const note = el("span", { className: "chart-note", role: "status" });
  pin.addEventListener("click", () => actions.pin());
  png.addEventListener("click", () => run(note, actions.png));
  csv.addEventListener("click", () => run(note, actions.csv));
  menu.addEventListener("toggle", () => { if (menu.open && !menu.sync) chartMenu(menu, store, id); });
  figure.querySelector("figcaption").append(el("span", { className: "chart-tools" }, note, pin, png, csv, menu));
}

async function run(note, action) {
  note.textContent = "";
  try {
    await action();
  } catch (error) {
    note.textContent = error.message;
  }
}

/** The body of a chart's own menu: its settings over the page's, and a way back to the page's. */
function chartMenu(menu, store, id) {
  const settings = settingControls(() => store.chart(id), (patch) => store.updateChart(id, patch));
  const follow = el("button", { type: "button", className: "link", textContent: "Use the page's view" });
  follow.addEventListener("click", () => store.followPage(id));
  menu.append(el("div", { className: "chart-menu-body" }, ...settings.elements, follow));
  menu.sync = settings.sync;
}

/** Shows a chart's pin and menu as the view has them now. */
export function syncTools(figure, pinned) {
  const pin = figure.querySelector(".chart-pin");
  if (pin) {
    pin.textContent = pinned ? "★" : "☆";
    pin.setAttribute("aria-pressed", String(pinned));
    pin.title = pinned ? "Unpin" : "Pin to the top of the page";
  }
  const menu = figure.querySelector(".chart-menu");
  if (menu && menu.sync) menu.sync();
}
