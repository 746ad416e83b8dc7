// One chart of the run page: reads its series from the chart endpoint at its pixel width, zooms by asking again
// for the selected range, and takes live points while the user is not zoomed in. How it draws them (one line per
// rank, rank 0 or their mean; smoothing; log y; the x axis; a y range without outliers) is its view, applied here
// in the browser: changing the view redraws what was read and asks the server for nothing.
import { addPoint, align, decode, fetchChart, fillLine, highest, newLine, nonFinite } from "./data.js";
import { chartView, DEFAULT_VIEW, forLogScale, outlierRange, rankMean, smooth } from "./view.js";

// The colours are the page's CSS variables (static/app.css: --chart-*, --overlay-*), as "#rrggbb"; these stand in
// where a variable is missing. They are read again when the theme changes (static/theme.js says "themechange"), and
// every chart drawn is drawn again in the new colours.
const FALLBACK = {
  palette: ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777", "#4b5563", "#65a30d"],
  overlays: ["#f59e0b", "#14b8a6", "#8b5cf6", "#ef4444", "#84cc16"],
  axis: "#4b5563",
  grid: "#e5e7eb",
};
let THEME = readTheme();
const DRAWN = new Set();  // the charts of this page, to draw again in a new theme's colours

function readTheme() {
  const style = getComputedStyle(document.documentElement);
  const read = (name, fallback) => style.getPropertyValue(name).trim() || fallback;
  return {
    palette: FALLBACK.palette.map((hex, i) => read(`--chart-${i + 1}`, hex)),
    overlays: FALLBACK.overlays.map((hex, i) => read(`--overlay-${i + 1}`, hex)),
    axis: read("--chart-axis", FALLBACK.axis),
    grid: read("--chart-grid", FALLBACK.grid),
  };
}

document.addEventListener("themechange", () => {
  THEME = readTheme();
  for (const chart of DRAWN) {
    if (!chart.figure.isConnected) DRAWN.delete(chart);
    else if (chart.plot) { chart.shape = ""; chart.draw(); }  // a new shape: made again with the new colours
  }
});
const HEIGHT = 260;
// A series may grow to this many points per pixel from live appends before it is read again downsampled:
// a page left open for hours keeps a bounded number of points.
const POINTS_PER_PIXEL = 4;
const SI = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
const IEC = [[2 ** 40, "TiB"], [2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"]];
// Tick spacings uPlot may choose, in seconds: whole seconds, minutes, hours and days on a wall clock (never
// :14.000 :14.500), and on "time since start" the same, with fractions of a second for a run that quick.
const MINUTES = [1, 2, 5, 10, 15, 30].map((m) => m * 60);
const HOURS = [1, 2, 3, 6, 12].map((h) => h * 3600);
const DAYS = [1, 2, 7, 14, 30, 91, 182, 365].map((d) => d * 86400);
const CLOCK_INCRS = [1, 2, 5, 10, 15, 30, ...MINUTES, ...HOURS, ...DAYS];
const DURATION_INCRS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, ...CLOCK_INCRS];
const BYTE_INCRS = Array.from({ length: 41 }, (_, i) => 2 ** (i + 10));  // 1 KiB, 2 KiB, ... 1 PiB: 16 GiB, not 18.6
const ALONE = () => chartView(DEFAULT_VIEW, "");  // a chart with no page around it draws the default view

export function color(index) {
  return THEME.palette[index % THEME.palette.length];
}

/** Each compared run's colour as an index for `color()` (so that it follows the theme), the same on every chart
 * and on every page that shows the run with others: the one its id names, or where two runs of the page would share
 * one, the next free one. */
export function runColors(ids) {
  const taken = new Set();
  const size = THEME.palette.length;
  return new Map(ids.map((id) => {
    let i = id % size;
    while (taken.has(i) && taken.size < size) i = (i + 1) % size;
    taken.add(i);
    return [id, i];
  }));
}

/** The index-th of `count` shades of a "#rrggbb" colour: the first is the colour itself, the last 60% of the way
 * to white, so a run's ranks read as one run and still apart. */
export function shade(hex, index, count) {
  const t = count > 1 ? (0.6 * index) / (count - 1) : 0;
  const mix = (at) => Math.round(parseInt(hex.slice(at, at + 2), 16) * (1 - t) + 255 * t);
  return "#" + [1, 3, 5].map((at) => mix(at).toString(16).padStart(2, "0")).join("");
}

/** A value as the axes, the summary and the legend write it, in engineering units: 14.4k, 3.2 ms, 1.5 s, 1.5 GiB. */
export function formatValue(unit, value) {
  if (value === null || value === undefined) return "–";
  if (!Number.isFinite(value)) return String(value);
  if (unit === "bytes") {
    const [size, name] = IEC.find(([at]) => Math.abs(value) >= at) || [1, "B"];
    return `${+(value / size).toPrecision(3)} ${name}`;
  }
  if (unit === "ms" && Math.abs(value) >= 1000) return formatValue("s", value / 1000);
  const big = SI.find(([at]) => Math.abs(value) >= at);
  // Learning rates like 0.0005 read as decimals, like their neighbours on the axis; only tinier ones as 3e-5.
  const text = big ? `${+(value / big[0]).toPrecision(3)}${big[1]}`
    : value !== 0 && Math.abs(value) < 1e-4 ? value.toExponential(2).replace(/\.?0+e/, "e")
      : String(+value.toPrecision(4));
  return unit && unit !== "/s" ? `${text} ${unit}` : text;
}

/** A wall-clock tick: the date where ticks are days apart (or at midnight), else the time to the minute or second. */
export function formatClock(seconds, incr) {
  const at = new Date(seconds * 1000);
  const midnight = !at.getHours() && !at.getMinutes() && !at.getSeconds();
  if (incr >= 86400 || midnight) return at.toLocaleDateString([], { month: "short", day: "numeric" });
  const parts = incr >= 60 ? { hour: "2-digit", minute: "2-digit" }
    : { hour: "2-digit", minute: "2-digit", second: "2-digit" };
  return at.toLocaleTimeString([], { ...parts, hour12: false });
}

/** Seconds as the "time since start" axis writes them: 45s, 12m, 1h 30m, 2d 4h. */
export function formatDuration(seconds) {
  const sign = seconds < 0 ? "-" : "";
  if (Math.abs(seconds) < 60) return `${sign}${+Math.abs(seconds).toPrecision(3)}s`;  // a quick run: 0.25s, 12.5s
  const s = Math.round(Math.abs(seconds));
  if (s < 3600) return `${sign}${Math.floor(s / 60)}m${s % 60 ? ` ${s % 60}s` : ""}`;
  if (s < 86400) return `${sign}${Math.floor(s / 3600)}h${s % 3600 >= 60 ? ` ${Math.floor((s % 3600) / 60)}m` : ""}`;
  return `${sign}${Math.floor(s / 86400)}d${s % 86400 >= 3600 ? ` ${Math.floor((s % 86400) / 3600)}h` : ""}`;
}

/** uPlot's y scale for a unit: a percentage is read against its whole scale, 0 to 100, not against the padding
 * uPlot puts around a flat line (GPUs at 97% drew an axis up to 150%). */
export function yScale(unit) {
  return unit === "%" ? { range: (u, min, max) => [0, Math.max(100, max ?? 100)] } : {};
}

/** The y range without the view's outlier fit: uPlot's own (on a log scale, whole decades), or the unit's. */
export function defaultRange(unit, min, max, log) {
  if (min === null || max === null || !Number.isFinite(min) || !Number.isFinite(max)) return log ? [1, 10] : [0, 1];
  if (log) return uPlot.rangeLog(min, max, 10, true);
  if (unit === "%") return yScale(unit).range(null, min, max);
  return uPlot.rangeNum(min, max, 0.1, true);
}

/** The x range: the data's own, or around a chart's only x, where uPlot would span a thousand days around one time
 * (it widens a single x before asking for the range: the data tell it). */
export function xRange(xs, min, max, time) {
  if (!xs.length || xs[0] !== xs[xs.length - 1]) return [min, max];
  const pad = time ? 60 : 1;
  return [xs[0] - pad, xs[0] + pad];
}

/** An axis in the theme's colours (read as uPlot draws, so a redraw takes a new theme's). */
function themed() {
  const line = { stroke: () => THEME.grid, width: 1 };
  return { stroke: () => THEME.axis, grid: line, ticks: line };
}

/** The x axis's ticks: on a wall clock and on "time since start", at round seconds, minutes, hours or days. */
function xTicks(kind) {
  if (kind === "wall") return { space: 60, incrs: CLOCK_INCRS, values: (u, splits, i, space, incr) =>
    splits.map((v) => formatClock(v, incr)) };
  if (kind === "rel") return { space: 50, incrs: DURATION_INCRS, values: (u, splits) => splits.map(formatDuration) };
  return {};
}

export class RunChart {
  /** `figure` carries data-chart: {id, title, unit, time, start, series: [{key, label, color, dashed}]}.
   * `view()` gives the chart's view now (view.js chartView); `origin` is the unix time the run started, where
   * "time since start" counts from; `onZoom(id, [start, end] | null)` hears of each zoom the user makes.
   * `runs` ([{id, label, origin, color}], `color` an index for color(); the compare page) draws each series for each of those runs instead of
   * `runId`'s, save the keys the spec's `absent` says a run never reported. */
  constructor(figure, runId, { view = ALONE, origin = null, onZoom = () => {}, runs = null } = {}) {
    this.figure = figure;
    this.runId = runId;
    this.spec = JSON.parse(figure.dataset.chart);
    this.el = figure.querySelector(".chart");
    this.summary = figure.querySelector(".chart-summary");
    this.legend = figure.querySelector(".chart-legend");
    this.runs = runs;
    this.sources = runs ? this.comparedSources(runs)
      : this.spec.series.map((s) => ({ ...s, run: runId, overlay: false, origin }));
    this.lines = new Map();  // "run|key|rank" -> line
    this.viewOf = view;
    this.onZoom = onZoom;
    const zoom = view().zoom;
    this.zoom = zoom ? { start: zoom[0], end: zoom[1] } : null;  // while zoomed in, as a link may ask from the start
    this.fetching = null;  // batches that came while a read was under way, applied after it
    this.plot = null;
    this.shape = "";
    this.drawn = "";
    this.resize = new ResizeObserver(() => this.plot && this.plot.setSize(this.size()));
    this.resize.observe(this.el);
    DRAWN.add(this);
    this.reload();
  }

  width() { return Math.max(100, this.el.clientWidth || 800); }
  size() { return { width: this.width(), height: HEIGHT }; }

  /** Reads every series again (given a Set of run ids, only those runs'): the whole run, or the zoomed range at full
   * resolution. */
  async reload(only = null) {
    if (this.fetching) { this.again = only && (!this.again || this.again === only) ? only : true; return; }
    this.fetching = [];
    // Time charts start at the run's creation (from step 0 their range would begin in 1970).
    const range = this.zoom ? { start: this.zoom.start, end: this.zoom.end } : { start: this.spec.start || null };
    try {
      const read = (s) => fetchChart(s.run, s.key, { width: this.width(), ...range })
        .then((chart) => [s, chart], () => [s, undefined]);  // a failed read draws the others, and says so
      const answers = await Promise.all((only ? this.sources.filter((s) => only.has(s.run)) : this.sources).map(read));
      if (!this.el.isConnected && !this.figure.isConnected) return;  // replaced while it read
      if (only) this.lines.forEach((line, id) => { if (only.has(line.source.run)) this.lines.delete(id); });
      else this.lines = new Map();
      for (const [source, chart] of answers) this.takeChart(source, chart);
      const pending = this.fetching;
      this.fetching = null;
      if (!this.zoom) pending.forEach((batch) => this.append(batch, false));
      this.draw();
    } finally {
      this.fetching = null;
      if (this.again) {
        const again = this.again;
        this.again = false;
        this.reload(again === true ? null : again);
      }
    }
  }

  takeChart(source, chart) {
    source.missing = chart === null;
    source.failed = chart === undefined;
    if (!chart) return;
    for (const rank of Object.keys(chart.ranks).map(Number).sort((a, b) => a - b)) {
      const line = this.line(source, rank);
      fillLine(line, chart.ranks[String(rank)]);
      this.timed = this.timed || line.time !== null;
    }
  }

  /** The line of a source's rank, made on first use. */
  line(source, rank) {
    const id = `${source.run}|${source.key}|${rank}`;
    if (!this.lines.has(id)) {
      const line = newLine({ source, rank, dashed: source.dashed });
      if (this.timed) line.time = [];  // a rank first seen live keeps times like the others
      this.lines.set(id, line);
    }
    return this.lines.get(id);
  }

  /** New raw points from the stream ({key: {steps, values, ranks, times?}}); ignored while zoomed in. Where the
   * stream gives no times, a point's time is when it arrived: a second or two after it was logged. */
  append(series, redraw = true) {
    if (this.fetching) { this.fetching.push(series); return; }
    if (this.zoom) { this.stale = true; return; }
    let changed = false;
    const now = Date.now() / 1000;
    for (const source of this.sources) {
      const points = !source.overlay && series[source.key];
      if (!points) continue;
      for (let i = 0; i < points.steps.length; i++) {
        const time = points.times ? points.times[i] : now;
        const line = this.line(source, points.ranks[i]);
        changed = addPoint(line, points.steps[i], decode(points.values[i]), time) || changed;
      }
    }
    if (!changed || !redraw) return;
    const longest = Math.max(...Array.from(this.lines.values(), (line) => line.steps.length));
    if (longest > POINTS_PER_PIXEL * this.width()) this.reload();  // downsampled again instead of growing
    else this.draw();
  }

  /** Another run's series on this chart; `origin` is that run's start, for the "time since start" axis. */
  addOverlay(run, label, key = "loss", origin = null) {
    const used = this.sources.filter((s) => s.overlay).length;
    const hue = THEME.overlays[used % THEME.overlays.length];
    this.sources.push({ key, label, color: hue, dashed: false, run, overlay: true, origin });
    this.reload();
  }

  removeOverlay(run) {
    this.sources = this.sources.filter((s) => !(s.overlay && s.run === run));
    this.reload();
  }

  overlays() { return this.sources.filter((s) => s.overlay).map((s) => ({ run: s.run, label: s.label })); }

  /** Zoom into steps [start, end]: read again at full resolution for just that range. */
  zoomTo(start, end) {
    start = Math.max(0, Math.floor(start));
    end = Math.ceil(end);
    if (!(end > start)) return;
    this.zoom = { start, end };
    this.onZoom(this.spec.id, [start, end]);
    this.reload();
  }

  resetZoom() {
    if (!this.zoom && !this.stale) return;
    this.zoom = null;
    this.stale = false;
    this.onZoom(this.spec.id, null);
    this.reload();
  }

  /** Draws again if the view changed (a zoom the view names, as after "reset view", is read anew). */
  viewChanged() {
    const view = this.viewOf();
    const wanted = view.zoom ? `${view.zoom[0]}-${view.zoom[1]}` : "";
    const have = this.zoom ? `${this.zoom.start}-${this.zoom.end}` : "";
    if (wanted !== have) {
      this.zoom = view.zoom ? { start: view.zoom[0], end: view.zoom[1] } : null;
      this.stale = false;
      this.reload();
      return;
    }
    if (JSON.stringify(view) !== this.drawn && !this.fetching) this.draw();
  }

  draw() {
    const view = this.viewOf();
    const shown = this.shown(view.ranks);
    const axis = this.axis(view.x, shown);
    this.plotted = shown.map((line) => this.plotLine(line, axis, view));
    this.view = view;
    this.axisNow = axis;
    const data = align(this.plotted.flatMap((p) => p.columns));
    const shape = JSON.stringify([this.plotted.map((p) => [p.label, p.color, p.dashed, p.dotted, p.columns.length]),
                                  axis.kind, axis.time, view.logY]);
    if (!this.plot || shape !== this.shape) {
      if (this.plot) this.plot.destroy();
      this.plot = new uPlot(this.options(this.plotted, axis, view), data, this.el);
      this.shape = shape;
    } else {
      this.plot.setData(data);
    }
    this.drawn = JSON.stringify(view);
    this.describe(shown, data[0].length, axis, view);
  }

  /** The lines to draw after the rank mode: every rank, the lowest rank, or the ranks' mean with their spread. */
  shown(mode) {
    if (this.runs) return this.comparedLines(mode);
    const several = this.sources.length > 1;
    const all = Array.from(this.lines.values());
    const groups = this.sources.map((source) => all.filter((l) => l.source === source).sort((a, b) => a.rank - b.rank));
    // Lines per rank take the ranks' colours; a series of one rank beside them takes a colour after theirs.
    const perRank = mode === "all" && groups.some((lines) => lines.length > 1);
    const shift = perRank ? Math.max(...all.map((l) => l.rank)) + 1 : 0;
    const out = [];
    this.sources.forEach((source, i) => {
      const lines = groups[i];
      if (lines.length === 1 || (lines.length > 1 && mode === "all")) {
        out.push(...lines.map((line) => this.labelled(line, lines.length > 1, several, shift)));
      } else if (lines.length > 1 && mode === "rank0") {
        out.push(this.labelled(lines[0], true, several, 0));
      } else if (lines.length > 1) {
        out.push(this.meanOf(source, lines, several));
      }
    });
    return out;
  }

  labelled(line, perRank, several, shift) {
    const { source } = line;
    const label = perRank ? `rank ${line.rank}${several ? " " + source.label : ""}` : source.label;
    const hue = source.overlay ? source.color : color(perRank ? line.rank : source.color + shift);
    return { ...line, label, color: hue };
  }

  meanOf(source, lines, several) {
    const label = `${several ? source.label + " " : ""}mean of ${lines.length} ranks (band: min to max)`;
    const hue = source.overlay ? source.color : color(source.color);
    return { ...rankMean(lines), source, rank: null, dashed: source.dashed, label, color: hue };
  }

  /** Each series of the spec once per compared run, save those of keys the run never reported; `index` is the
   * series' place in the spec. */
  comparedSources(runs) {
    const absent = this.spec.absent || {};
    return runs.flatMap((run) => this.spec.series.map((s, index) => ({ ...s, index }))
      .filter((s) => !(absent[run.id] || []).includes(s.key))
      .map((s) => ({ ...s, run: run.id, overlay: false, origin: run.origin })));
  }

  /** The compared runs' lines after the rank mode, each in its run's colour: a series' ranks in shades of it, the
   * chart's second series (validation loss beside loss) dotted. On GPU and host charts, whose series are devices,
   * each device is a shade, and a dashed limit takes the shade of the value it bounds. */
  comparedLines(mode) {
    return this.runs.flatMap((run) => {
      const hue = color(run.color);
      const own = this.sources.filter((s) => s.run === run.id).map((source) => this.runLines(run, source, mode));
      if (this.spec.time) {
        const lines = own.flat();
        const solid = lines.filter((line) => !line.dashed).length;
        let at = -1;
        return lines.map((line) => ({ ...line, color: shade(hue, line.dashed ? Math.max(at, 0) : ++at, solid) }));
      }
      return own.flatMap((lines) => lines.map((line, i) => ({
        ...line, color: shade(hue, i, lines.length), dotted: line.source.index > 0 && !line.dashed,
      })));
    });
  }

  /** One compared run's lines of one series after the rank mode, labelled by run: "#12 rank 1", "#12 validation
   * loss", "#12 mean of 4 ranks (band: min to max)". */
  runLines(run, source, mode) {
    const name = run.label + (this.spec.series.length > 1 ? ` ${source.label}` : "");
    const lines = Array.from(this.lines.values()).filter((l) => l.source === source).sort((a, b) => a.rank - b.rank);
    if (lines.length > 1 && mode === "mean") {
      const label = `${name} mean of ${lines.length} ranks (band: min to max)`;
      return [{ ...rankMean(lines), source, rank: null, dashed: source.dashed, label }];
    }
    const kept = lines.length > 1 && mode === "rank0" ? lines.slice(0, 1) : lines;
    return kept.map((line) => ({ ...line, label: lines.length > 1 ? `${name} rank ${line.rank}` : name }));
  }

  /** How x is drawn: by step, by wall-clock time, or by time since the run started. Charts of GPU and host samples
   * count steps in unix seconds already; the others need the times the endpoint gives with each bucket, and fall
   * back to steps (saying so) where it gives none. */
  axis(x, shown) {
    if (this.spec.time) {
      if (x !== "rel") return { kind: "wall", time: true, xOf: (line) => line.steps, note: "" };
      return { kind: "rel", time: false, xOf: (line) => this.sinceStart(line, line.steps), note: "" };
    }
    if (x === "step") return { kind: "step", time: false, xOf: (line) => line.steps, note: "" };
    if (!shown.length || !shown.every((line) => line.time)) {
      const note = "no wall-clock times from the server: by step";
      return { kind: "step", time: false, xOf: (line) => line.steps, note };
    }
    if (x === "wall") return { kind: "wall", time: true, xOf: (line) => line.time, note: "" };
    return { kind: "rel", time: false, xOf: (line) => this.sinceStart(line, line.time), note: "" };
  }

  /** Seconds since the line's run started: its start where known, else the first time this chart has of it. */
  sinceStart(line, times) {
    let origin = line.source.origin;
    if (origin === null || origin === undefined) {
      const firsts = Array.from(this.lines.values()).filter((l) => l.source.run === line.source.run)
        .map((l) => (this.spec.time ? l.steps : l.time || [])[0]).filter(Number.isFinite);
      origin = firsts.length ? Math.min(...firsts) : 0;
    }
    return times.map((t) => t - origin);
  }

  /** A shown line as uPlot columns: its value (smoothed where the view smooths), the raw value faint behind a
   * smoothed one, and its min and max for the band; on a log scale, values at or below zero are left out. */
  plotLine(line, axis, view) {
    const x = axis.xOf(line);
    const smoothed = view.smoothing > 0 && !line.dashed ? smooth(line.last, view.smoothing) : null;
    let dropped = 0;
    const column = (values, counted = false) => {
      if (!view.logY) return { x, values };
      const log = forLogScale(values);
      if (counted) dropped = log.dropped;
      return { x, values: log.values };
    };
    const columns = [column(smoothed || line.last, !smoothed)];
    if (smoothed) columns.push(column(line.last, true));
    if (!line.dashed) columns.push(column(line.max), column(line.min));
    return { label: line.label, color: line.color, dashed: line.dashed, dotted: !!line.dotted, smoothed: !!smoothed,
             columns, dropped, steps: line.steps, x, source: line.source };
  }

  options(plotted, axis, view) {
    const { series, bands } = this.seriesOptions(plotted);
    const unit = this.spec.unit;
    const chart = this;
    const xLabel = { step: "step", wall: "", rel: "time since start" }[axis.kind];
    return {
      ...this.size(),
      legend: { show: false },
      scales: {
        x: { time: axis.time, range: (u, min, max) => xRange(u.data[0], min, max, axis.time) },
        y: { ...(view.logY ? { distr: 3, log: 10 } : {}), range: (u, min, max) => chart.yRange(min, max) },
      },
      series,
      bands,
      axes: [{ label: xLabel, ...themed(), ...xTicks(axis.kind) },
             { size: 70, ...themed(), ...(unit === "bytes" ? { incrs: BYTE_INCRS } : {}),
               values: (u, splits) => splits.map((v) => formatValue(unit, v)) }],
      cursor: { drag: { x: true, y: false, setScale: false } },
      hooks: {
        setSelect: [(u) => {
          if (u.select.width < 3) return;
          const start = u.posToVal(u.select.left, "x");
          const end = u.posToVal(u.select.left + u.select.width, "x");
          u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
          chart.zoomX(start, end);
        }],
        ready: [(u) => u.over.addEventListener("dblclick", () => chart.resetZoom())],
      },
    };
  }

  /** uPlot's series for the plotted lines: each line, its raw line faint behind when smoothed, and its band. */
  seriesOptions(plotted) {
    const series = [{ label: this.axisNow.kind }];
    const bands = [];
    const thin = (stroke, label) => ({ label, stroke, width: 0.5, spanGaps: true, points: { show: false } });
    for (const line of plotted) {
      // uPlot's own choice of points: shown where they are few enough to see apart (a single value is a dot).
      series.push({ label: line.label, stroke: line.color, width: line.dashed ? 1 : 1.5,
                    dash: line.dashed ? [6, 4] : line.dotted ? [2, 3] : undefined, spanGaps: true });
      if (line.smoothed) series.push({ ...thin(line.color + "55", line.label + " raw"), width: 1 });
      if (line.dashed) continue;
      series.push(thin(line.color + "44", line.label + " max"), thin(line.color + "44", line.label + " min"));
      bands.push({ series: [series.length - 2, series.length - 1], fill: line.color + "1f" });
    }
    return { series, bands };
  }

  /** The y range: the view's "ignore outliers" range of the lines drawn (not their bands), or uPlot's own. */
  yRange(min, max) {
    const view = this.view || this.viewOf();
    if (view.outliers && this.plotted) {
      const values = this.plotted.flatMap((p) => p.columns.slice(0, p.smoothed ? 2 : 1).flatMap((c) => c.values));
      const range = outlierRange(values, { log: view.logY });
      if (range) return range;
    }
    return defaultRange(this.spec.unit, min, max, view.logY);
  }

  /** Zoom to the steps whose points lie between two x positions (times, on the time axes). */
  zoomX(x0, x1) {
    const axis = this.axisNow;
    if (axis.kind === "step" || (this.spec.time && axis.kind === "wall")) return this.zoomTo(x0, x1);
    let lo = Infinity, hi = -Infinity;
    for (const line of this.plotted) {
      line.x.forEach((x, i) => {
        if (x >= x0 && x <= x1) { lo = Math.min(lo, line.steps[i]); hi = Math.max(hi, line.steps[i]); }
      });
    }
    if (hi > lo) this.zoomTo(lo, hi);
  }

  /** The summary and legend a person reads, and data attributes that say what is drawn. */
  describe(shown, points, axis, view) {
    const top = highest(shown);
    for (const el of [this.figure, this.summary]) {
      el.dataset.points = String(points);
      el.dataset.lines = String(this.plotted.length);
      el.dataset.max = top === null ? "" : String(top);
      el.dataset.zoomed = this.zoom ? "true" : "false";
    }
    Object.assign(this.figure.dataset, { labels: JSON.stringify(this.plotted.map((p) => p.label)), x: axis.kind,
      log: String(view.logY), smoothing: String(view.smoothing), outliers: String(view.outliers), ranks: view.ranks });
    this.summary.textContent = this.sentence(shown, points, axis, view, top);
    this.drawLegend(this.plotted);
  }

  sentence(shown, points, axis, view, top) {
    const unit = this.spec.unit;
    let text = points ? `${points} point${points === 1 ? "" : "s"}` : "No points yet";
    const first = shown.find((l) => l.last.length);
    if (first) {
      const i = first.last.length - 1;
      text += ` · last ${first.label} ${formatValue(unit, first.last[i])}`;
      const at = first.steps[i];
      text += this.spec.time ? ` at ${new Date(at * 1000).toLocaleTimeString()}` : ` at step ${at}`;
    }
    if (top !== null) text += ` · max ${formatValue(unit, top)}`;
    const bad = nonFinite(shown);
    if (bad) text += ` · ${bad} NaN/inf values not drawn`;
    const dropped = this.plotted.reduce((n, p) => n + p.dropped, 0);
    if (dropped) text += ` · ${dropped} values ≤ 0 left out of the log scale`;
    if (axis.note) text += ` · ${axis.note}`;
    if (view.overridden) text += " · this chart's own view";
    if (this.zoom) text += " · zoomed in (double-click to zoom out)";
    const failed = this.sources.filter((s) => s.failed).map((s) => s.key);
    if (failed.length) text += ` · could not read ${failed.join(", ")}`;
    const missing = this.sources.filter((s) => s.missing && s.overlay);
    if (missing.length) text += ` · no ${missing[0].key} in ${missing.map((s) => s.label).join(", ")}`;
    return text;
  }

  drawLegend(plotted) {
    this.legend.replaceChildren(...plotted.map((line) => {
      const item = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.className = "swatch" + (line.dashed ? " dashed" : line.dotted ? " dotted" : "");
      swatch.style.borderColor = line.color;
      item.append(swatch, line.label);
      if (line.source.overlay) item.append(" ", this.removeButton(line));
      return item;
    }));
  }

  removeButton(line) {
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "link";
    remove.textContent = "×";
    remove.title = `Remove ${line.label}`;
    remove.setAttribute("aria-label", `Remove ${line.label}`);
    remove.addEventListener("click", () => this.figure.dispatchEvent(
      new CustomEvent("overlay-remove", { bubbles: true, detail: { run: line.source.run } })));
    return remove;
  }

  destroy() {
    this.resize.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }
}
