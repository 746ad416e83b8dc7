// Reading a series from the chart endpoint, and keeping one line's points in step order.
// The endpoint answers per rank and bucket the min, max and last value; a line keeps all three, so the band
// between min and max shows a one-step spike even when thousands of steps share one pixel.

const NON_FINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };

/** A value as the wire sends it: a number, or "NaN" / "Infinity" / "-Infinity" as a string. */
export function decode(value) {
  return typeof value === "string" ? NON_FINITE[value] : value;
}

/** GET /api/runs/{run}/chart for one key; null when the run has no such series (404). */
export async function fetchChart(run, key, { width, start = null, end = null }) {
  const params = new URLSearchParams({ key: key, width: String(Math.max(1, Math.min(4000, Math.round(width)))) });
  if (start !== null) params.set("start_step", String(Math.max(0, Math.floor(start))));
  if (end !== null) params.set("end_step", String(Math.max(0, Math.ceil(end))));
  const response = await fetch(`/api/runs/${run}/chart?${params}`);
  if (response.status === 404) return null;
  if (!response.ok) throw new Error(`chart of ${key}: HTTP ${response.status}`);
  return response.json();
}

/** An empty line: parallel arrays by step. */
export function newLine(props) {
  return { ...props, steps: [], min: [], max: [], last: [] };
}

/** Replaces a line's points with one rank's buckets from the endpoint. */
export function fillLine(line, buckets) {
  line.steps = buckets.step.slice();
  line.min = buckets.min.map(decode);
  line.max = buckets.max.map(decode);
  line.last = buckets.last.map(decode);
}

/** Adds one raw point in step order; a step the line has already is skipped (a retry, or a bucket's last step). */
export function addPoint(line, step, value) {
  let i = line.steps.length;
  while (i > 0 && line.steps[i - 1] > step) i--;  // points come in order; a replayed spool may bring an older one
  if (i > 0 && line.steps[i - 1] === step) return false;
  line.steps.splice(i, 0, step);
  line.min.splice(i, 0, value);
  line.max.splice(i, 0, value);
  line.last.splice(i, 0, value);
  return true;
}

/** uPlot's columns for these lines: one shared x (the union of steps), per line its last, max and min. */
export function columns(lines) {
  const xs = Array.from(new Set(lines.flatMap((line) => line.steps))).sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const data = [xs];
  for (const line of lines) {
    const arrays = line.dashed ? [line.last] : [line.last, line.max, line.min];
    for (const values of arrays) {
      const column = new Array(xs.length).fill(null);
      // NaN and infinities cannot be drawn: they are left out (the line spans them), and counted in the summary.
      line.steps.forEach((step, i) => { column[at.get(step)] = Number.isFinite(values[i]) ? values[i] : null; });
      data.push(column);
    }
  }
  return data;
}

/** The highest finite value of any line (its max where it has one): what a spike reaches. */
export function highest(lines) {
  let top = -Infinity;
  for (const line of lines) {
    for (const v of line.max) if (Number.isFinite(v) && v > top) top = v;
    for (const v of line.last) if (Number.isFinite(v) && v > top) top = v;
  }
  return top === -Infinity ? null : top;
}

/** How many values of the lines are NaN or infinite. */
export function nonFinite(lines) {
  return lines.reduce((n, line) => n + line.last.filter((v) => !Number.isFinite(v)).length, 0);
}
