// One chart of the run page: reads its series from the chart endpoint at its pixel width, zooms by asking again
// for the selected range, and takes live points while the user is not zoomed in.
import { addPoint, columns, decode, fetchChart, fillLine, highest, newLine, nonFinite } from "./data.js";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
                 "#4b5563", "#65a30d"];
const OVERLAY_COLORS = ["#f59e0b", "#14b8a6", "#8b5cf6", "#ef4444", "#84cc16"];
const HEIGHT = 260;
// A series may grow to this many points per pixel from live appends before it is read again downsampled:
// a page left open for hours keeps a bounded number of points.
const POINTS_PER_PIXEL = 4;
const GIB = 2 ** 30;

function color(index, alpha) {
  const hex = PALETTE[index % PALETTE.length];
  return alpha === undefined ? hex : hex + Math.round(alpha * 255).toString(16).padStart(2, "0");
}

/** A value as the axes, the summary and the legend write it. */
export function formatValue(unit, value) {
  if (value === null || value === undefined) return "–";
  if (unit === "bytes") return (value / GIB).toFixed(1) + " GiB";
  // Learning rates like 0.0005 read as decimals, like their neighbours on the axis; only tinier ones as 3e-5.
  const text = Math.abs(value) >= 1e4 || (value !== 0 && Math.abs(value) < 1e-4)
    ? value.toExponential(2).replace(/\.?0+e/, "e") : String(+value.toPrecision(4));
  return unit && unit !== "/s" ? `${text} ${unit}` : text;
}

/** uPlot's y scale for a unit: a percentage is read against its whole scale, 0 to 100, not against the padding
 * uPlot puts around a flat line (GPUs at 97% drew an axis up to 150%). */
export function yScale(unit) {
  return unit === "%" ? { range: (u, min, max) => [0, Math.max(100, max ?? 100)] } : {};
}

export class RunChart {
  /** `figure` carries data-chart: {id, title, unit, time, series: [{key, label, color, dashed, per_rank}]}. */
  constructor(figure, runId) {
    this.figure = figure;
    this.runId = runId;
    this.spec = JSON.parse(figure.dataset.chart);
    this.el = figure.querySelector(".chart");
    this.summary = figure.querySelector(".chart-summary");
    this.legend = figure.querySelector(".chart-legend");
    this.sources = this.spec.series.map((s) => ({ ...s, run: runId, rank: null, overlay: false }));
    this.lines = new Map();  // "run|key|rank" -> line
    this.zoom = null;  // {start, end} while zoomed in
    this.fetching = null;  // batches that came while a read was under way, applied after it
    this.plot = null;
    this.shape = "";
    this.resize = new ResizeObserver(() => this.plot && this.plot.setSize(this.size()));
    this.resize.observe(this.el);
    this.reload();
  }

  width() { return Math.max(100, this.el.clientWidth || 800); }
  size() { return { width: this.width(), height: HEIGHT }; }

  /** Reads every series again: the whole run, or the zoomed range at full resolution. */
  async reload() {
    if (this.fetching) { this.again = true; return; }
    this.fetching = [];
    // Time charts start at the run's creation (from step 0 their range would begin in 1970).
    const range = this.zoom ? { start: this.zoom.start, end: this.zoom.end } : { start: this.spec.start || null };
    try {
      const answers = await Promise.all(this.sources.map((s) => fetchChart(s.run, s.key, { width: this.width(), ...range })
        .then((chart) => [s, chart], () => [s, undefined])));
      this.lines = new Map();
      for (const [source, chart] of answers) this.takeChart(source, chart);
      const pending = this.fetching;
      this.fetching = null;
      if (!this.zoom) pending.forEach((batch) => this.append(batch, false));
      this.draw();
    } finally {
      this.fetching = null;
      if (this.again) { this.again = false; this.reload(); }
    }
  }

  takeChart(source, chart) {
    source.missing = chart === null;
    source.failed = chart === undefined;
    if (!chart) return;
    const ranks = Object.keys(chart.ranks).map(Number).sort((a, b) => a - b);
    if (!source.per_rank && ranks.length) {
      if (source.rank === null || !ranks.includes(source.rank)) source.rank = ranks[0];
      fillLine(this.line(source, source.rank), chart.ranks[String(source.rank)]);
      return;
    }
    for (const rank of ranks) fillLine(this.line(source, rank), chart.ranks[String(rank)]);
  }

  /** The line of a source (and rank for per-rank series), made on first use. */
  line(source, rank) {
    const id = `${source.run}|${source.key}|${source.per_rank ? rank : ""}`;
    if (!this.lines.has(id)) {
      const several = this.sources.filter((s) => s.per_rank).length > 1;
      const label = source.per_rank ? `rank ${rank}${several ? " " + source.label : ""}` : source.label;
      const hue = source.overlay ? source.color : color(source.per_rank ? rank : source.color);
      this.lines.set(id, newLine({ label, color: hue, dashed: source.dashed, source }));
    }
    return this.lines.get(id);
  }

  /** New raw points from the stream ({key: {steps, values, ranks}}); ignored while zoomed in. */
  append(series, redraw = true) {
    if (this.fetching) { this.fetching.push(series); return; }
    if (this.zoom) { this.stale = true; return; }
    let changed = false;
    for (const source of this.sources) {
      const points = !source.overlay && series[source.key];
      if (!points) continue;
      for (let i = 0; i < points.steps.length; i++) {
        const rank = points.ranks[i];
        if (!source.per_rank) {
          if (source.rank === null) source.rank = rank;
          if (rank !== source.rank) continue;
        }
        changed = addPoint(this.line(source, rank), points.steps[i], decode(points.values[i])) || changed;
      }
    }
    if (!changed || !redraw) return;
    const longest = Math.max(...Array.from(this.lines.values(), (line) => line.steps.length));
    if (longest > POINTS_PER_PIXEL * this.width()) this.reload();  // downsampled again instead of growing
    else this.draw();
  }

  addOverlay(run, label, key = "loss") {
    const used = this.sources.filter((s) => s.overlay).length;
    const hue = OVERLAY_COLORS[used % OVERLAY_COLORS.length];
    this.sources.push({ key, label, color: hue, dashed: false, per_rank: false, run, rank: null, overlay: true });
    this.reload();
  }

  removeOverlay(run) {
    this.sources = this.sources.filter((s) => !(s.overlay && s.run === run));
    this.reload();
  }

  overlays() { return this.sources.filter((s) => s.overlay).map((s) => ({ run: s.run, label: s.label })); }

  /** Zoom into [start, end]: read again at full resolution for just that range. */
  zoomTo(start, end) {
    if (!(end > start)) return;
    this.zoom = { start, end };
    this.reload();
  }

  resetZoom() {
    if (!this.zoom && !this.stale) return;
    this.zoom = null;
    this.stale = false;
    this.reload();
  }

  draw() {
    const lines = Array.from(this.lines.values());
    const data = columns(lines);
    const shape = lines.map((l) => `${l.label}/${l.dashed}`).join("|");
    if (!this.plot || shape !== this.shape) {
      if (this.plot) this.plot.destroy();
      this.plot = new uPlot(this.options(lines), data, this.el);
      this.shape = shape;
    } else {
      this.plot.setData(data);
    }
    this.describe(lines, data[0].length);
  }

  options(lines) {
    const series = [{ label: this.spec.time ? "time" : "step" }];
    const bands = [];
    for (const line of lines) {
      series.push({ label: line.label, stroke: line.color, width: line.dashed ? 1 : 1.5, dash: line.dashed ? [6, 4] : undefined,
                    spanGaps: true, points: { show: false } });
      if (line.dashed) continue;
      const thin = { stroke: line.color + "66", width: 0.5, spanGaps: true, points: { show: false } };
      series.push({ ...thin, label: line.label + " max" }, { ...thin, label: line.label + " min" });
      bands.push({ series: [series.length - 2, series.length - 1], fill: line.color + "22" });
    }
    const unit = this.spec.unit;
    const chart = this;
    return {
      ...this.size(),
      legend: { show: false },
      scales: { x: { time: this.spec.time }, y: yScale(unit) },
      series,
      bands,
      axes: [{ label: this.spec.time ? "" : "step" },
             { size: 70, values: (u, splits) => splits.map((v) => formatValue(unit, v)) }],
      cursor: { drag: { x: true, y: false, setScale: false } },
      hooks: {
        setSelect: [(u) => {
          if (u.select.width < 3) return;
          const start = u.posToVal(u.select.left, "x");
          const end = u.posToVal(u.select.left + u.select.width, "x");
          u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
          chart.zoomTo(start, end);
        }],
        ready: [(u) => u.over.addEventListener("dblclick", () => chart.resetZoom())],
      },
    };
  }

  /** The summary and legend a person reads, and data attributes that say what is drawn. */
  describe(lines, points) {
    const top = highest(lines);
    const bad = nonFinite(lines);
    for (const el of [this.figure, this.summary]) {
      el.dataset.points = String(points);
      el.dataset.lines = String(lines.length);
      el.dataset.max = top === null ? "" : String(top);
      el.dataset.zoomed = this.zoom ? "true" : "false";
    }
    this.figure.dataset.labels = JSON.stringify(lines.map((l) => l.label));
    const first = lines.find((l) => l.last.length);
    let text = points ? `${points} points` : "No points yet";
    if (first) {
      const i = first.last.length - 1;
      text += ` · last ${first.label} ${formatValue(this.spec.unit, first.last[i])}`;
      text += this.spec.time ? ` at ${new Date(first.steps[i] * 1000).toLocaleTimeString()}` : ` at step ${first.steps[i]}`;
    }
    if (top !== null) text += ` · max ${formatValue(this.spec.unit, top)}`;
    if (bad) text += ` · ${bad} NaN/inf values not drawn`;
    if (this.zoom) text += " · zoomed in (double-click to zoom out)";
    const missing = this.sources.filter((s) => s.missing && s.overlay).map((s) => s.label);
    if (missing.length) text += ` · no loss in ${missing.join(", ")}`;
    this.summary.textContent = text;
    this.drawLegend(lines);
  }

  drawLegend(lines) {
    this.legend.replaceChildren(...lines.map((line) => {
      const item = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.className = "swatch" + (line.dashed ? " dashed" : "");
      swatch.style.borderColor = line.color;
      item.append(swatch, line.label);
      if (line.source.overlay) {
        const remove = document.createElement("button");
        remove.type = "button";
        remove.className = "link";
        remove.textContent = "×";
        remove.title = `Remove ${line.label}`;
        remove.setAttribute("aria-label", `Remove ${line.label}`);
        remove.addEventListener("click", () => this.figure.dispatchEvent(
          new CustomEvent("overlay-remove", { bubbles: true, detail: { run: line.source.run } })));
        item.append(" ", remove);
      }
      return item;
    }));
  }

  destroy() {
    this.resize.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }
}
