// The chart view's pure parts, shared by the run page and anything else that draws its charts, and tested alone in
// a browser (tests/e2e/test_chart_view_js.py): TensorBoard's smoothing, the y range that ignores outliers, the
// mean and spread of several ranks, the filter's matching, and the view as a URL's query string and back.

export const X_AXES = ["step", "wall", "rel"];  // by step, by wall-clock time, by time since the run started
export const RANK_MODES = ["all", "rank0", "mean"];
export const MAX_SMOOTHING = 0.99;
export const OVERRIDABLE = ["smoothing", "logY", "x", "outliers"];  // what a chart's own menu may set for itself

/** The whole page's view: what a copied link restores. `charts` holds each chart's own overrides and zoom;
 * `folded` null leaves each section as the page folds it by default (the dashboard's bookkeeping sections folded). */
export const DEFAULT_VIEW = Object.freeze({
  filter: "", pins: [], folded: null, smoothing: 0, logY: false, x: "step", outliers: false, ranks: "all", charts: {},
});

/** TensorBoard's smoothing (its scalar card's `classicSmoothing`): a debiased exponential moving average.
 * Each finite value feeds `last = last * w + (1 - w) * value`, divided by 1 - w^n where n counts the finite values
 * so far; NaN and infinities are passed through unsmoothed and not fed in; a constant series is left as it is. */
export function smooth(values, weight) {
  const w = Number.isFinite(weight) ? Math.max(0, Math.min(weight, 1)) : 0;
  if (!values.length || values.every((v) => v === values[0])) return values.slice();
  let last = 0;
  let finite = 0;
  return values.map((value) => {
    if (!Number.isFinite(value)) return value;
    last = last * w + (1 - w) * value;
    finite++;
    return last / (w === 1 ? 1 : 1 - Math.pow(w, finite));
  });
}

/** The q-quantile (0..1) of sorted numbers, linearly interpolated between the two nearest. */
export function quantile(sorted, q) {
  const at = (sorted.length - 1) * q;
  const below = Math.floor(at);
  const above = Math.min(sorted.length - 1, below + 1);
  return sorted[below] + (sorted[above] - sorted[below]) * (at - below);
}

/** A y range that leaves out the rarest extremes: the 1st to 99th percentile of the finite values, padded by 5% of
 * its span (on a log scale, by a factor); null without a finite value. */
export function outlierRange(values, { log = false, lower = 0.01, upper = 0.99, pad = 0.05 } = {}) {
  const usable = values.filter((v) => Number.isFinite(v) && (!log || v > 0));
  if (!usable.length) return null;
  const scaled = (log ? usable.map(Math.log10) : usable).sort((a, b) => a - b);
  let lo = quantile(scaled, lower);
  let hi = quantile(scaled, upper);
  const margin = (hi - lo) * pad || Math.abs(hi) * pad || 1;  // a flat line still gets a visible range
  lo -= margin;
  hi += margin;
  return log ? [10 ** lo, 10 ** hi] : [lo, hi];
}

/** Values a log axis can draw: the others (zero, negative) become null, and are counted. */
export function forLogScale(values) {
  let dropped = 0;
  const kept = values.map((v) => {
    if (v === null || !Number.isFinite(v) || v > 0) return v;
    dropped++;
    return null;
  });
  return { values: kept, dropped };
}

/** The mean of several ranks' lines by step, and their min and max (the band). A rank counts at a step from its
 * first point to its last, with the value of its latest point at or before that step: ranks that report at slightly
 * different steps still average over all of them instead of jumping between subsets. `time` is the ranks' mean
 * time where every rank has one. Non-finite values are left out of the mean. */
export function rankMean(lines) {
  const steps = Array.from(new Set(lines.flatMap((line) => line.steps))).sort((a, b) => a - b);
  const cursors = lines.map(() => -1);
  const out = { steps, last: [], min: [], max: [], time: lines.every((l) => l.time) ? [] : null };
  for (const step of steps) {
    let sum = 0, count = 0, lo = Infinity, hi = -Infinity, when = 0, timed = 0;
    lines.forEach((line, i) => {
      while (cursors[i] + 1 < line.steps.length && line.steps[cursors[i] + 1] <= step) cursors[i]++;
      const at = cursors[i];
      if (at < 0 || step > line.steps[line.steps.length - 1]) return;
      if (out.time) { when += line.time[at]; timed++; }
      const value = line.last[at];
      if (!Number.isFinite(value)) return;
      sum += value; count++; lo = Math.min(lo, value); hi = Math.max(hi, value);
    });
    out.last.push(count ? sum / count : NaN);
    out.min.push(count ? lo : NaN);
    out.max.push(count ? hi : NaN);
    if (out.time) out.time.push(when / timed);
  }
  return out;
}

/** A test of a chart's words against the filter: a case-insensitive regular expression, or where the filter is not
 * a valid one (`loss(`), a plain substring. */
export function matcher(filter) {
  const text = (filter || "").trim();
  if (!text) return () => true;
  try {
    const pattern = new RegExp(text, "i");
    return (words) => pattern.test(words);
  } catch {
    const lower = text.toLowerCase();
    return (words) => words.toLowerCase().includes(lower);
  }
}

/** A chart's effective view: the page's settings with the chart's own overrides on top, and its zoom. */
export function chartView(view, chartId) {
  const own = view.charts[chartId] || {};
  const pick = (name) => (own[name] !== undefined ? own[name] : view[name]);
  return {
    smoothing: pick("smoothing"), logY: pick("logY"), x: pick("x"), outliers: pick("outliers"), ranks: view.ranks,
    zoom: own.zoom || null, overridden: OVERRIDABLE.some((name) => own[name] !== undefined),
  };
}

const LIST_SEPARATOR = ".";  // ids are [a-z0-9-]: a dot never occurs in one, and stays readable in a URL
const PARAMS = ["filter", "pin", "fold", "smooth", "logy", "x", "outliers", "ranks"];
const CHART_PARAM = "c.";

/** The view as query parameters, merged into `search` (other parameters of the page are kept); defaults are left
 * out, so a page at its default view has a bare URL. */
export function encodeView(view, search = "") {
  const params = new URLSearchParams(search);
  for (const name of [...params.keys()]) {
    if (PARAMS.includes(name) || name.startsWith(CHART_PARAM)) params.delete(name);
  }
  if (view.filter) params.set("filter", view.filter);
  if (view.pins.length) params.set("pin", view.pins.join(LIST_SEPARATOR));
  if (view.folded) params.set("fold", view.folded.join(LIST_SEPARATOR));  // "fold=": every section opened by hand
  if (view.smoothing) params.set("smooth", String(view.smoothing));
  if (view.logY) params.set("logy", "1");
  if (view.x !== "step") params.set("x", view.x);
  if (view.outliers) params.set("outliers", "1");
  if (view.ranks !== "all") params.set("ranks", view.ranks);
  for (const [id, own] of Object.entries(view.charts).sort()) {
    const text = encodeChart(own);
    if (text) params.set(CHART_PARAM + id, text);
  }
  return params.toString();
}

/** A chart's overrides as `s0.6_log1_xwall_out0_z100-2000`: each only where set. */
function encodeChart(own) {
  const parts = [];
  if (own.smoothing !== undefined) parts.push(`s${own.smoothing}`);
  if (own.logY !== undefined) parts.push(`log${own.logY ? 1 : 0}`);
  if (own.x !== undefined) parts.push(`x${own.x}`);
  if (own.outliers !== undefined) parts.push(`out${own.outliers ? 1 : 0}`);
  if (own.zoom) parts.push(`z${own.zoom[0]}-${own.zoom[1]}`);
  return parts.join("_");
}

/** The view a query string names; what it does not name (or names wrongly) is the default. */
export function decodeView(search) {
  const params = new URLSearchParams(search);
  const list = (name) => (params.get(name) || "").split(LIST_SEPARATOR).filter(Boolean);
  const view = {
    ...DEFAULT_VIEW,
    filter: params.get("filter") || "",
    pins: list("pin"),
    folded: params.has("fold") ? list("fold") : null,
    smoothing: smoothingOf(params.get("smooth")) ?? 0,
    logY: params.get("logy") === "1",
    x: X_AXES.includes(params.get("x")) ? params.get("x") : "step",
    outliers: params.get("outliers") === "1",
    ranks: RANK_MODES.includes(params.get("ranks")) ? params.get("ranks") : "all",
    charts: {},
  };
  for (const [name, value] of params) {
    if (!name.startsWith(CHART_PARAM)) continue;
    const own = decodeChart(value);
    if (Object.keys(own).length) view.charts[name.slice(CHART_PARAM.length)] = own;
  }
  return view;
}

function decodeChart(text) {
  const own = {};
  for (const part of text.split("_")) {
    let m;
    if ((m = /^s([\d.]+)$/.exec(part)) && smoothingOf(m[1]) !== null) own.smoothing = smoothingOf(m[1]);
    else if ((m = /^log([01])$/.exec(part))) own.logY = m[1] === "1";
    else if ((m = /^x(\w+)$/.exec(part)) && X_AXES.includes(m[1])) own.x = m[1];
    else if ((m = /^out([01])$/.exec(part))) own.outliers = m[1] === "1";
    else if ((m = /^z(\d+)-(\d+)$/.exec(part)) && Number(m[2]) > Number(m[1])) own.zoom = [Number(m[1]), Number(m[2])];
  }
  return own;
}

function smoothingOf(text) {
  const value = Number(text);
  return text && Number.isFinite(value) && value >= 0 ? Math.min(value, MAX_SMOOTHING) : null;
}
