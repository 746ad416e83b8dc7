// A page of charts in foldable sections (`details.chart-section[data-section-id]`, each with a `.chart-grid` of
// `figure[data-chart]`), drawn the way a ViewStore says: a filter hides charts, pinned charts move to a section of
// their own at the top, folded sections stay folded. A chart is built, and reads its series, only once its figure
// comes near the viewport: a page of 200 charts asks for the few in view, not for 200 series at once.
import { RunChart } from "./chart.js";
import { chartTools, el, syncTools } from "./controls.js";
import { chartCsv, chartPng, save } from "./export.js";
import { matcher } from "./view.js";

const NEAR_VIEWPORT = "400px 0px";  // built a little before it scrolls in, so it is drawn when it arrives

export class ChartGrid {
  /** `root` holds the sections; `origin` is the unix time the run started (for "time since start"); `onBuilt(chart)`
   * hears of each chart as it is built; `onCount(shown, all)` of how many charts the filter leaves. `runs` (the
   * compare page) draws each chart for those runs (RunChart's option); `name` starts the exported files' names;
   * `onKeys(keys)` hears the keys of the built charts each time they change. */
  constructor(root, { runId, store, origin = null, onBuilt = () => {}, onCount = () => {}, onKeys = () => {},
                      runs = null, name = `run-${runId}` }) {
    this.runId = runId;
    this.runs = runs;
    this.name = name;
    this.store = store;
    this.origin = origin;
    this.onBuilt = onBuilt;
    this.onCount = onCount;
    this.onKeys = onKeys;  // hears the keys of the built charts whenever a chart is built or dropped
    this.charts = new Map();  // chart id -> RunChart, the built ones only
    this.observer = new IntersectionObserver((entries) => this.seen(entries), { rootMargin: NEAR_VIEWPORT });
    store.subscribe(() => this.applyView());
    this.index(root);
  }

  /** Reads the sections and figures under `root`, gives each figure its tools, and watches the unbuilt ones. */
  index(root) {
    this.root = root;
    this.figures = new Map();
    this.words = new Map();
    for (const section of root.querySelectorAll("details.chart-section[data-section-id]")) {
      section.addEventListener("toggle", () => this.foldsChanged());
      section.querySelectorAll("figure[data-chart]").forEach((figure, order) => {
        Object.assign(figure.dataset, { home: section.dataset.sectionId, order: String(order) });
        this.adopt(figure);
      });
    }
    this.applyView();
  }

  adopt(figure) {
    const spec = JSON.parse(figure.dataset.chart);
    this.figures.set(spec.id, figure);
    this.words.set(spec.id, [spec.title, ...spec.series.map((s) => s.key)].join("\n"));
    if (!figure.querySelector(".chart-tools")) {
      chartTools(figure, spec.title, this.store, spec.id, {
        pin: () => this.togglePin(spec.id),
        png: async () => save(await chartPng(this.build(figure)), `${this.name}-${spec.id}.png`),
        csv: async () => save(new Blob([await chartCsv(this.build(figure))], { type: "text/csv" }),
                              `${this.name}-${spec.id}.csv`),
      });
    }
    if (!this.charts.has(spec.id)) this.observer.observe(figure);
  }

  seen(entries) {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      this.observer.unobserve(entry.target);
      this.build(entry.target);
    }
  }

  /** The chart of a figure, built (and its series read) now if it was not yet. */
  build(figure) {
    const id = JSON.parse(figure.dataset.chart).id;
    if (this.charts.has(id)) return this.charts.get(id);
    const chart = new RunChart(figure, this.runId, {
      view: () => this.store.chart(id), origin: this.origin, runs: this.runs,
      onZoom: (chartId, zoom) => this.store.updateChart(chartId, { zoom: zoom || undefined }),
    });
    this.charts.set(id, chart);
    figure.dataset.built = "true";
    this.onBuilt(chart);
    this.onKeys(this.builtKeys());
    return chart;
  }

  chart(id) { return this.charts.get(id); }

  /** The keys of the charts built so far: what the page's point stream follows. */
  builtKeys() {
    return Array.from(this.charts.values(), (chart) => chart.spec.series.map((s) => s.key)).flat();
  }

  /** Keys whose points the stream only named: a chart of one, built since the stream last opened, reads again. */
  stale(keys) {
    const named = new Set(keys);
    this.charts.forEach((chart) => { if (chart.spec.series.some((s) => named.has(s.key))) chart.reload(); });
  }

  /** New points from the stream, for the charts that exist: one built later reads them with the rest. */
  append(series) {
    this.charts.forEach((chart) => chart.append(series));
  }

  /** Takes a new layout from the server (a key arrived): charts whose spec did not change keep their figure, drawn
   * and zoomed as they are; `reread` reads all of them again (the stream missed points). */
  replace(root, { reread = false } = {}) {
    const kept = new Set();
    for (const fresh of root.querySelectorAll("figure[data-chart]")) {
      const id = JSON.parse(fresh.dataset.chart).id;
      const old = this.figures.get(id);
      if (old && this.charts.has(id) && old.dataset.chart === fresh.dataset.chart) {
        fresh.replaceWith(old);
        kept.add(id);
      }
    }
    for (const [id, chart] of this.charts) {
      if (!kept.has(id)) { chart.destroy(); this.charts.delete(id); }
    }
    this.onKeys(this.builtKeys());
    this.observer.disconnect();
    this.root.replaceWith(root);
    this.index(root);
    if (reread) this.charts.forEach((chart) => chart.reload());
  }

  togglePin(id) {
    const pins = this.store.view.pins;
    this.store.update({ pins: pins.includes(id) ? pins.filter((p) => p !== id) : [...pins, id] });
  }

  /** Shows the store's view: folds, pins, filter, and each built chart's own settings. */
  applyView() {
    const view = this.store.view;
    this.applyPins(view.pins);  // first: it may make the "Pinned" section, which the folds then fold
    this.applyFolds(view.folded);
    this.applyFilter(view.filter);
    this.charts.forEach((chart) => chart.viewChanged());
    this.figures.forEach((figure, id) => syncTools(figure, view.pins.includes(id)));
  }

  sections() { return Array.from(this.root.querySelectorAll("details.chart-section[data-section-id]")); }

  applyFolds(folded) {
    const closed = folded ?? this.defaultFolded();
    for (const section of this.sections()) section.open = !closed.includes(section.dataset.sectionId);
  }

  /** A section folded or opened by hand: the view (and so the URL) follows. */
  foldsChanged() {
    const folded = this.sections().filter((s) => !s.open).map((s) => s.dataset.sectionId);
    const shown = this.store.view.folded;
    if (shown === null ? folded.join() !== this.defaultFolded().join() : folded.join() !== shown.join()) {
      this.store.update({ folded });
    }
  }

  defaultFolded() {
    return this.sections().filter((s) => s.dataset.folded === "default").map((s) => s.dataset.sectionId);
  }

  applyPins(pins) {
    const section = this.pinnedSection();
    const grid = section.querySelector(".chart-grid");
    const wanted = pins.map((id) => this.figures.get(id)).filter(Boolean);
    if (Array.from(grid.children).some((figure, i) => figure !== wanted[i]) || grid.children.length !== wanted.length) {
      Array.from(grid.children).filter((f) => !wanted.includes(f)).forEach((f) => this.sendHome(f));
      wanted.forEach((figure) => grid.append(figure));
    }
  }

  /** The "Pinned" section at the top, made on first use. */
  pinnedSection() {
    let section = this.root.querySelector("details.chart-section[data-section-id='pinned']");
    if (!section) {
      section = el("details", { className: "chart-section pinned", open: true, hidden: true },
                   el("summary", {}, el("h3", { textContent: "Pinned" })), el("div", { className: "chart-grid" }));
      section.dataset.sectionId = "pinned";
      section.dataset.section = "";
      section.addEventListener("toggle", () => this.foldsChanged());
      const first = this.root.querySelector("details.chart-section");
      this.root.insertBefore(section, first);
    }
    return section;
  }

  /** Back to its own section, in its place there. */
  sendHome(figure) {
    const home = this.root.querySelector(`details.chart-section[data-section-id="${figure.dataset.home}"] .chart-grid`);
    if (!home) return;
    const order = Number(figure.dataset.order);
    const before = Array.from(home.children).find((f) => Number(f.dataset.order) > order);
    home.insertBefore(figure, before || null);
  }

  applyFilter(filter) {
    const match = matcher(filter);
    let shown = 0;
    for (const [id, figure] of this.figures) {
      figure.hidden = !match(this.words.get(id));
      if (!figure.hidden) shown++;
    }
    for (const section of this.sections()) section.hidden = !section.querySelector("figure[data-chart]:not([hidden])");
    this.onCount(shown, this.figures.size);
  }
}
