// The run page's charts: built from the layout the server put in #charts, fed by the page's server-sent event
// stream (event "points", JSON of new raw points), which htmx's SSE extension hands to #chart-points.
// When a key arrives that the layout was not made with, or the stream says points were missed (the page fell
// further behind than the server's live log keeps), the page asks for its `charts` fragment again.
import { RunChart } from "./charts/chart.js";

const REFRESH_AT_MOST_EVERY_MS = 2000;
let charts = [];
let knownKeys = new Set();
let overlays = [];  // [{run, label}] on the loss chart, kept across a refresh of the layout
let refreshing = false;
let lastRefresh = 0;

function section() { return document.getElementById("charts"); }

function start() {
  const el = section();
  if (!el) return;
  const runId = Number(el.dataset.runId);
  knownKeys = new Set(JSON.parse(el.dataset.keys || "[]"));
  charts = Array.from(el.querySelectorAll("figure[data-chart]"), (figure) => new RunChart(figure, runId));
  const loss = charts.find((chart) => chart.spec.id === "loss");
  if (loss) {
    overlays.forEach((o) => loss.addOverlay(o.run, o.label));
    fillRunPicker(runId, loss);
  }
}

async function fillRunPicker(runId, loss) {
  const select = document.getElementById("overlay-runs");
  if (!select) return;
  const response = await fetch("/api/runs?limit=500");
  if (!response.ok) return;
  for (const run of (await response.json()).items) {
    if (run.id === runId) continue;
    select.add(new Option(`#${run.id} ${run.name}`, String(run.id)));
  }
  select.addEventListener("change", () => {
    const run = Number(select.value);
    if (!run || overlays.some((o) => o.run === run)) return;
    const label = select.selectedOptions[0].textContent + " loss";
    overlays.push({ run, label });
    loss.addOverlay(run, label);
    select.value = "";
  });
  loss.figure.addEventListener("overlay-remove", (event) => {
    overlays = overlays.filter((o) => o.run !== event.detail.run);
    loss.removeOverlay(event.detail.run);
  });
}

/** Replaces #charts with the server's current layout, and rebuilds every chart from the endpoint; `force` skips
 * the rate limit (not a refresh under way: what it reads is newer than what asked for it). */
async function refreshLayout(force = false) {
  if (refreshing || (!force && Date.now() - lastRefresh < REFRESH_AT_MOST_EVERY_MS)) return;
  refreshing = true;
  lastRefresh = Date.now();
  try {
    const el = section();
    const response = await fetch(`/runs/${el.dataset.runId}`, { headers: { "HX-Target": "charts" } });
    if (!response.ok) return;
    charts.forEach((chart) => chart.destroy());
    el.outerHTML = await response.text();
    start();
  } finally {
    refreshing = false;
  }
}

const points = document.getElementById("chart-points");
if (points) {
  points.addEventListener("htmx:sseBeforeMessage", (event) => {
    event.preventDefault();  // JSON for the charts, not HTML to swap in
    const { series, missed } = JSON.parse(event.detail.data);
    if (missed) {  // points after this page's cursor left the live log unseen: read every chart again
      refreshLayout(true);
      return;
    }
    charts.forEach((chart) => chart.append(series));
    if (Object.keys(series).some((key) => !knownKeys.has(key))) {
      refreshLayout();
      // A key refused by the rate limit is looked at again with the next message; retry once later as well.
      setTimeout(() => { if (Object.keys(series).some((key) => !knownKeys.has(key))) refreshLayout(); },
                 REFRESH_AT_MOST_EVERY_MS + 100);
    }
  });
}
start();
