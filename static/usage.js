// The Usage page's chart: each group's hours per week, stacked (uPlot draws no stacks itself: each group's bars are
// the running sum up to it, drawn from the top of the stack down so that each covers the ones above it). Colours are
// the page's chart variables (static/app.css), read again when the theme changes (static/theme.js).
const box = document.getElementById("usage-chart");
const FALLBACK = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

function readTheme() {
  const style = getComputedStyle(document.documentElement);
  const read = (name, fallback) => style.getPropertyValue(name).trim() || fallback;
  return { palette: FALLBACK.map((hex, i) => read(`--chart-${i + 1}`, hex)),
           axis: read("--chart-axis", "#4b5563"), grid: read("--chart-grid", "#e5e7eb") };
}

if (box) {
  let theme = readTheme();
  const chart = JSON.parse(box.dataset.chart);
  const sums = [];
  let below = chart.weeks.map(() => 0);
  for (const group of chart.groups) {
    below = below.map((value, i) => value + group.values[i]);
    sums.push(below);
  }
  const colour = (i) => () => theme.palette[i % theme.palette.length];
  const bars = uPlot.paths.bars({ size: [0.6, 60] });
  const order = [...sums.keys()].reverse();  // the tallest stack first, so each lower one is drawn over it
  const series = order.map((i) => ({
    label: chart.groups[i].name, paths: bars, points: { show: false }, fill: colour(i), stroke: colour(i),
    value: (_u, _v, _s, index) => index == null ? "–" : chart.groups[i].values[index].toFixed(1),
  }));
  const line = { stroke: () => theme.grid, width: 1 };
  const axis = { stroke: () => theme.axis, grid: line, ticks: line };
  const opts = {
    width: Math.min(box.clientWidth || 800, 1000), height: 260, series: [{}, ...series],
    // Half a week either side, so that the first and last weeks' bars stand whole.
    scales: { x: { time: true, range: (_u, min, max) => [min - 3.5 * 86400, max + 3.5 * 86400] },
              y: { range: (_u, _min, max) => [0, max * 1.05 || 1] } },
    axes: [{ ...axis }, { ...axis, label: chart.unit }],
  };
  const plot = new uPlot(opts, [chart.weeks, ...order.map((i) => sums[i])], box);
  document.addEventListener("themechange", () => { theme = readTheme(); plot.redraw(false, true); });
}
