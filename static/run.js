// The run page's charts: a ChartGrid over the sections the server laid out in #charts, its view kept in the URL
// and set from the toolbar, fed by a server-sent event stream of new raw points for the charts built so far
// (./charts/points.js; the status and files fragments come by htmx's own stream). When a key arrives that the layout
// was not made with, or the
// stream says points were missed (the page fell further behind than the server's live log keeps), the page asks
// for its `charts` fragment again and keeps the charts whose layout did not change.
import { ChartGrid } from "./charts/grid.js";
import { toolbar } from "./charts/controls.js";
import { PointStream } from "./charts/points.js";
import { ViewStore } from "./charts/store.js";

const REFRESH_AT_MOST_EVERY_MS = 2000;
const store = new ViewStore();
let grid = null;
let knownKeys = new Set();
let overlays = [];  // [{run, label, origin}] on the loss chart, kept across a refresh of the layout
let refreshing = false;
let lastRefresh = 0;

function section() { return document.getElementById("charts"); }

function start() {
  const el = section();
  if (!el) return;
  const bar = toolbar(document.getElementById("chart-toolbar"), store);
  knownKeys = new Set(JSON.parse(el.dataset.keys || "[]"));
  grid = new ChartGrid(el, {
    runId: Number(el.dataset.runId), store, origin: Number(el.dataset.started) || null,
    onBuilt: (chart) => {
      if (chart.spec.id === "loss") overlays.forEach((o) => chart.addOverlay(o.run, o.label, "loss", o.origin));
    },
    onCount: (shown, all) => bar.count(shown, all),
    onKeys: (keys) => points?.watch(keys),
  });
  fillRunPicker(Number(el.dataset.runId));
  document.addEventListener("overlay-remove", (event) => {
    overlays = overlays.filter((o) => o.run !== event.detail.run);
    grid.chart("loss")?.removeOverlay(event.detail.run);
  });
}

/** The loss chart's "Compare with run" picker: every other run, each added as an overlay of its loss. */
async function fillRunPicker(runId) {
  const select = document.getElementById("overlay-runs");
  if (!select || select.dataset.filled) return;
  select.dataset.filled = "true";
  const response = await fetch("/api/runs?limit=500");
  if (!response.ok) return;
  const starts = new Map();
  for (const run of (await response.json()).items) {
    if (run.id === runId) continue;
    starts.set(run.id, Date.parse(run.started_at || run.created_at) / 1000);
    select.add(new Option(`#${run.id} ${run.name}`, String(run.id)));
  }
  select.addEventListener("change", () => {
    const run = Number(select.value);
    if (!run || overlays.some((o) => o.run === run)) return;
    const overlay = { run, label: select.selectedOptions[0].textContent + " loss", origin: starts.get(run) ?? null };
    overlays.push(overlay);
    grid.chart("loss")?.addOverlay(overlay.run, overlay.label, "loss", overlay.origin);
    select.value = "";
  });
}

/** Takes the server's current layout; `force` skips the rate limit (not a refresh under way: what it reads is newer
 * than what asked for it) and reads every chart again. */
async function refreshLayout(force = false) {
  if (refreshing || (!force && Date.now() - lastRefresh < REFRESH_AT_MOST_EVERY_MS)) return;
  refreshing = true;
  lastRefresh = Date.now();
  try {
    const response = await fetch(`/runs/${section().dataset.runId}`, { headers: { "HX-Target": "charts" } });
    if (!response.ok) return;
    const holder = document.createElement("template");
    holder.innerHTML = await response.text();
    const fresh = holder.content.querySelector("#charts");
    fresh.querySelector("#chart-toolbar").replaceWith(document.getElementById("chart-toolbar"));  // as it is
    knownKeys = new Set(JSON.parse(fresh.dataset.keys || "[]"));
    grid.replace(fresh, { reread: force });
    fillRunPicker(Number(fresh.dataset.runId));  // a loss chart new in this layout brings its picker
  } finally {
    refreshing = false;
  }
}

function newKeys(keys) { return keys.some((key) => !knownKeys.has(key)); }

/** A message of the points' stream: the built charts' new points, and the names of the other keys that got some. */
function takePoints({ series, others = [], missed }) {
  if (missed) {  // points after this page's cursor left the live log unseen: read every chart again
    refreshLayout(true);
    return;
  }
  grid?.append(series);
  grid?.stale(others);  // a chart built since the stream last opened: its points in this message were only named
  const keys = [...Object.keys(series), ...others];
  if (newKeys(keys)) {
    refreshLayout();
    // A key refused by the rate limit is looked at again with the next message; retry once later as well.
    setTimeout(() => { if (newKeys(keys)) refreshLayout(); }, REFRESH_AT_MOST_EVERY_MS + 100);
  }
}

const holder = document.getElementById("chart-points");
const points = holder ? new PointStream(holder.dataset.stream, takePoints) : null;
start();
points?.watch(grid ? grid.builtKeys() : []);
