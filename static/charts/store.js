// The page's chart view, kept in its URL: read from the query string as the page loads, written back (replaceState:
// no history entry per slider move) after every change, so a copied link shows the same charts the same way.
import { DEFAULT_VIEW, OVERRIDABLE, chartView, decodeView, encodeView } from "./view.js";

export class ViewStore {
  constructor(search = location.search) {
    this.view = decodeView(search);
    this.listeners = [];
    this.scheduled = false;
  }

  /** The effective view of one chart (the page's, with its own overrides and zoom). */
  chart(id) { return chartView(this.view, id); }

  subscribe(listener) { this.listeners.push(listener); }

  /** Changes page-wide settings: {filter, pins, folded, smoothing, logY, x, outliers, ranks}. */
  update(patch) {
    this.view = { ...this.view, ...patch };
    this.changed();
  }

  /** Changes one chart's own settings; a value of undefined gives that setting back to the page. */
  updateChart(id, patch) {
    const own = { ...(this.view.charts[id] || {}), ...patch };
    for (const name of Object.keys(own)) if (own[name] === undefined || own[name] === null) delete own[name];
    const charts = { ...this.view.charts };
    if (Object.keys(own).length) charts[id] = own;
    else delete charts[id];
    this.update({ charts });
  }

  /** Gives every setting of a chart back to the page (its zoom stays). */
  followPage(id) {
    this.updateChart(id, Object.fromEntries(OVERRIDABLE.map((name) => [name, undefined])));
  }

  reset() {
    this.view = { ...DEFAULT_VIEW };
    this.changed();
  }

  /** Tells the listeners once per frame however many changes came in it (a slider sends one per pixel). */
  changed() {
    if (this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => {
      this.scheduled = false;
      this.writeUrl();
      this.listeners.forEach((listener) => listener(this.view));
    });
  }

  writeUrl() {
    const query = encodeView(this.view, location.search);
    const url = location.pathname + (query ? `?${query}` : "") + location.hash;
    if (url !== location.pathname + location.search + location.hash) history.replaceState(history.state, "", url);
  }
}
