// Reading a series from the chart endpoint, and keeping one line's points in step order.
// The endpoint answers per rank and bucket the min, max and last value; a line keeps all three, so the band
// between min and max shows a one-step spike even when thousands of steps share one pixel. Where the endpoint also
// gives each bucket's wall-clock `time`, the line keeps it for the time axes.

const NON_FINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };
// A page of 200 charts must not ask for 200 series at once: the server would queue them all behind one another and
// the charts in view would wait for those below. Reads beyond this many wait their turn, in the order asked.
const MAX_CONCURRENT_READS = 6;
let reading = 0;
const waiting = [];

/** A value as the wire sends it: a number, or "NaN" / "Infinity" / "-Infinity" as a string. */
export function decode(value) {
  return typeof value === "string" ? NON_FINITE[value] : value;
}

/** Runs `read` when fewer than MAX_CONCURRENT_READS reads are under way. */
export async function throttled(read) {
  if (reading < MAX_CONCURRENT_READS) reading++;
  else await new Promise((resolve) => waiting.push(resolve));  // the read that ends hands its place over
  try {
    return await read();
  } finally {
    const next = waiting.shift();
    if (next) next();
    else reading--;
  }
}

/** GET /api/runs/{run}/chart for one key; null when the run has no such series (404). */
export async function fetchChart(run, key, { width, start = null, end = null }) {
  const params = new URLSearchParams({ key: key, width: String(Math.max(1, Math.min(4000, Math.round(width)))) });
  if (start !== null) params.set("start_step", String(Math.max(0, Math.floor(start))));
  if (end !== null) params.set("end_step", String(Math.max(0, Math.ceil(end))));
  return throttled(async () => {
    const response = await fetch(`/api/runs/${run}/chart?${params}`);
    if (response.status === 404) return null;
    if (!response.ok) throw new Error(`chart of ${key}: HTTP ${response.status}`);
    return response.json();
  });
}

/** An empty line: parallel arrays by step; `time` stays null where the server gives no times. */
export function newLine(props) {
  return { ...props, steps: [], min: [], max: [], last: [], time: null };
}

/** Replaces a line's points with one rank's buckets from the endpoint. */
export function fillLine(line, buckets) {
  line.steps = buckets.step.slice();
  line.min = buckets.min.map(decode);
  line.max = buckets.max.map(decode);
  line.last = buckets.last.map(decode);
  line.time = Array.isArray(buckets.time) ? buckets.time.slice() : null;
}

/** Adds one raw point in step order; a step the line has already is skipped (a retry, or a bucket's last step). */
export function addPoint(line, step, value, time) {
  let i = line.steps.length;
  while (i > 0 && line.steps[i - 1] > step) i--;  // points come in order; a replayed spool may bring an older one
  if (i > 0 && line.steps[i - 1] === step) return false;
  line.steps.splice(i, 0, step);
  line.min.splice(i, 0, value);
  line.max.splice(i, 0, value);
  line.last.splice(i, 0, value);
  if (line.time) line.time.splice(i, 0, time);
  return true;
}

/** uPlot's columns: one shared x (the union of every line's x), then each of `columns` ({x, values}) aligned on it,
 * null where that line has no point. NaN and infinities cannot be drawn: they are null as well (the line spans
 * them), and counted in the summary. */
export function align(columns) {
  const xs = Array.from(new Set(columns.flatMap((column) => column.x))).sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const data = [xs];
  for (const column of columns) {
    const aligned = new Array(xs.length).fill(null);
    column.x.forEach((x, i) => {
      const value = column.values[i];
      aligned[at.get(x)] = Number.isFinite(value) ? value : null;
    });
    data.push(aligned);
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
