// The compare page: one chart per metric the runs have in common, the first run's line and the others overlaid,
// each read downsampled from the chart endpoint (static/charts/chart.js). While any of the runs is still going,
// the charts are read again every few seconds.
import { RunChart } from "./charts/chart.js";

const LIVE_RELOAD_MS = 5000;
const section = document.getElementById("compare-charts");
if (section) {
  const runs = JSON.parse(section.dataset.runs);  // [{id, label}], the first one's own line, the others overlaid
  const charts = Array.from(section.querySelectorAll("figure[data-chart]"), (figure) => {
    const chart = new RunChart(figure, runs[0].id);
    const key = chart.spec.series[0].key;
    runs.slice(1).forEach((run) => chart.addOverlay(run.id, run.label, key));
    figure.addEventListener("overlay-remove", (event) => chart.removeOverlay(event.detail.run));
    return chart;
  });
  if (section.dataset.live === "true") setInterval(() => charts.forEach((chart) => chart.reload()), LIVE_RELOAD_MS);
}
