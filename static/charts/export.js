// A chart's exports: the picture as PNG (uPlot's canvas under the chart's title, with its legend), and its points as
// CSV, read from the API (GET /api/runs/{id}/metrics/{key}?format=csv): every point of every rank in the range the
// chart shows, not the downsampled buckets it draws.

const FONT = "system-ui, -apple-system, 'Segoe UI', sans-serif";

/** The chart as a PNG blob: title, plot, legend, on white. */
export async function chartPng(chart) {
  const plot = chart.plot;
  if (!plot) throw new Error("the chart is not drawn yet");
  const source = plot.ctx.canvas;  // uPlot draws the axes, grid and lines on this one canvas
  const ratio = source.width / plot.width;  // the device pixel ratio it drew at
  const pad = 12 * ratio;
  const title = 16 * ratio;
  const canvas = document.createElement("canvas");
  const ctx = canvas.getContext("2d");
  ctx.font = `${12 * ratio}px ${FONT}`;
  const rows = legendRows(ctx, chart.plotted || [], source.width, ratio);
  canvas.width = source.width + 2 * pad;
  canvas.height = pad + title * 1.6 + source.height + rows.length * 18 * ratio + pad;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.fillStyle = "#1f2937";
  ctx.font = `600 ${title}px ${FONT}`;
  const runs = chart.runs ? `runs ${chart.runs.map((run) => run.label).join(", ")}` : `run ${chart.runId}`;
  ctx.fillText(`${chart.spec.title} · ${runs}`, pad, pad + title);
  ctx.drawImage(source, pad, pad + title * 1.6);
  drawLegend(ctx, rows, pad, pad + title * 1.6 + source.height, ratio);
  return new Promise((resolve) => canvas.toBlob(resolve, "image/png"));
}

/** The legend's entries laid out in rows that fit the width: [[{x, label, color, dashed, dotted}]]. */
function legendRows(ctx, plotted, width, ratio) {
  const rows = [[]];
  let x = 0;
  for (const line of plotted) {
    const span = 24 * ratio + ctx.measureText(line.label).width + 16 * ratio;
    if (x + span > width && rows[rows.length - 1].length) { rows.push([]); x = 0; }
    rows[rows.length - 1].push({ x, label: line.label, color: line.color, dashed: line.dashed, dotted: line.dotted });
    x += span;
  }
  return rows.filter((row) => row.length);
}

function drawLegend(ctx, rows, left, top, ratio) {
  ctx.font = `${12 * ratio}px ${FONT}`;
  rows.forEach((row, r) => {
    const y = top + (r + 0.8) * 18 * ratio;
    for (const entry of row) {
      ctx.strokeStyle = entry.color;
      ctx.lineWidth = 3 * ratio;
      ctx.setLineDash(entry.dashed ? [4 * ratio, 3 * ratio] : entry.dotted ? [1.5 * ratio, 2.5 * ratio] : []);
      ctx.beginPath();
      ctx.moveTo(left + entry.x, y - 4 * ratio);
      ctx.lineTo(left + entry.x + 18 * ratio, y - 4 * ratio);
      ctx.stroke();
      ctx.fillStyle = "#1f2937";
      ctx.fillText(entry.label, left + entry.x + 24 * ratio, y);
    }
  });
}

/** The chart's points as CSV text: the API's own file for a chart of one key of one run; for several keys (or
 * compared runs), one file whose rows each start with their key (and run). Overlaid runs are not in it (their own
 * pages export them). */
export async function chartCsv(chart) {
  const sources = chart.sources.filter((s) => !s.overlay);
  const range = chart.zoom;
  const bodies = await Promise.all(sources.map((s) => fetchCsv(s.run, s.key, range)));
  if (sources.length === 1) return bodies[0];
  const byRun = new Set(sources.map((s) => s.run)).size > 1;
  const byKey = new Set(sources.map((s) => s.key)).size > 1;
  const quote = (text) => `"${text.replace(/"/g, '""')}"`;
  const out = [];
  bodies.forEach((body, i) => {
    const [header, ...rows] = body.split(/\r?\n/).filter(Boolean);
    const names = [...(byRun ? ["run"] : []), ...(byKey ? ["key"] : [])];
    if (!out.length) out.push(`${names.join(",")},${header}`);
    const prefix = [...(byRun ? [sources[i].run] : []), ...(byKey ? [quote(sources[i].key)] : [])].join(",");
    rows.forEach((row) => out.push(`${prefix},${row}`));
  });
  return out.join("\n") + "\n";
}

/** GET /api/runs/{run}/metrics/{key}?format=csv over [start, end] (all of it without a zoom). */
export async function fetchCsv(run, key, range) {
  const params = new URLSearchParams({ format: "csv" });
  if (range) {
    params.set("start_step", String(range.start));
    params.set("end_step", String(range.end));
  }
  const path = key.split("/").map(encodeURIComponent).join("/");
  const response = await fetch(`/api/runs/${run}/metrics/${path}?${params}`);
  if (!response.ok) throw new Error(`${key}: HTTP ${response.status}`);
  if (!(response.headers.get("content-type") || "").includes("csv")) {
    throw new Error("this server answers no CSV yet");
  }
  return response.text();
}

/** Offers a blob to the user as a download named `name`. */
export function save(blob, name) {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
}
