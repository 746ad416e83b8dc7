// The compare page: the run page's chart grid (static/charts/grid.js) over the sections the server laid out for
// every key any compared run has, each chart a line per run and rank (a run in its colour, its ranks in shades of
// it), with the same toolbar and the view kept in the URL. While a run is still going, the charts in view read that
// run's series again every few seconds; charts out of view, and runs that have ended, are not read again. The
// options table shows only the rows that differ, or all of them, as its toggle (and the URL's ?options=) says.
import { ChartGrid } from "./charts/grid.js";
import { color, runColors } from "./charts/chart.js";
import { toolbar } from "./charts/controls.js";
import { ViewStore } from "./charts/store.js";

const LIVE_RELOAD_MS = 5000;

/** Each run's colour on its swatches in the runs' key and the summary's heads, in the theme's palette. */
function paintSwatches(colors) {
  for (const holder of document.querySelectorAll("[data-run]")) {
    const swatch = holder.querySelector(".swatch");
    if (swatch) swatch.style.borderColor = color(colors.get(Number(holder.dataset.run)));
  }
}

/** The options table's toggle: its class hides the rows that do not differ; the choice goes into the URL. */
function optionsToggle() {
  const toggle = document.getElementById("only-differing");
  const table = document.getElementById("compare-options");
  if (!toggle || !table) return;
  const show = () => {
    table.classList.toggle("only-differing", toggle.checked);
    document.getElementById("no-differing").hidden = !(toggle.checked && !table.querySelector("tr.differs"));
  };
  toggle.addEventListener("change", () => {
    show();
    const params = new URLSearchParams(location.search);
    params.set("options", toggle.checked ? "differ" : "all");
    history.replaceState(history.state, "", `${location.pathname}?${params}${location.hash}`);
  });
  show();
}

/** Reads the live runs' series again every few seconds, for the built charts in view, while the tab is shown. */
function rereadLive(grid, runs, figures) {
  const live = new Set(runs.filter((run) => run.live).map((run) => run.id));
  if (!live.size) return;
  const inView = new Set();
  const watch = new IntersectionObserver((entries) => entries.forEach((entry) => {
    if (entry.isIntersecting) inView.add(entry.target);
    else inView.delete(entry.target);
  }));
  figures.forEach((figure) => watch.observe(figure));
  setInterval(() => {
    if (document.hidden) return;
    for (const figure of inView) grid.chart(JSON.parse(figure.dataset.chart).id)?.reload(live);
  }, LIVE_RELOAD_MS);
}

function start() {
  optionsToggle();
  const section = document.getElementById("compare-charts");
  if (!section) return;
  const colors = runColors(JSON.parse(section.dataset.runs).map((run) => run.id));
  const runs = JSON.parse(section.dataset.runs).map((run) => ({ ...run, color: colors.get(run.id) }));
  paintSwatches(colors);
  document.addEventListener("themechange", () => paintSwatches(colors));  // the charts redraw themselves
  const store = new ViewStore();
  const bar = toolbar(document.getElementById("chart-toolbar"), store);
  const grid = new ChartGrid(section, {
    runId: runs[0].id, runs, store, name: `compare-${runs.map((run) => run.id).join("-")}`,
    onCount: (shown, all) => bar.count(shown, all),
  });
  rereadLive(grid, runs, section.querySelectorAll("figure[data-chart]"));
}

start();
