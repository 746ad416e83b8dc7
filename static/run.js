// The run page's loss chart: points arrive on the page's server-sent event stream (event "points"), which htmx's
// SSE extension hands to this element; we take them before htmx would swap them in as HTML.
(function () {
  "use strict";
  const el = document.getElementById("loss-chart");
  if (!el) return;
  const summary = document.getElementById("chart-summary");
  const NON_FINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };
  const steps = [];
  const values = [];

  const chart = new uPlot({
    width: el.clientWidth || 800,
    height: 320,
    scales: { x: { time: false } },
    series: [{ label: "step" }, { label: "loss", stroke: "#2563eb", width: 1.5, spanGaps: false }],
    axes: [{ label: "step" }, { label: "loss" }],
  }, [steps, values], el);

  function add(step, value) {
    // Points come in step order; a replayed spool may bring an older one, which is put in its place.
    let i = steps.length;
    while (i > 0 && steps[i - 1] > step) i--;
    if (i > 0 && steps[i - 1] === step) return;
    steps.splice(i, 0, step);
    values.splice(i, 0, Number.isFinite(value) ? value : null);  // NaN and inf are gaps in the line
  }

  el.addEventListener("htmx:sseBeforeMessage", function (event) {
    event.preventDefault();  // this is JSON for the chart, not HTML to swap in
    const loss = JSON.parse(event.detail.data).series.loss;
    if (!loss) return;
    let last = null;
    for (let i = 0; i < loss.steps.length; i++) {
      if (loss.ranks[i] !== 0) continue;
      const value = typeof loss.values[i] === "string" ? NON_FINITE[loss.values[i]] : loss.values[i];
      add(loss.steps[i], value);
      last = { step: loss.steps[i], value: value };
    }
    chart.setData([steps, values]);
    if (last) {
      summary.textContent = steps.length + " points · last loss " + last.value.toPrecision(4) + " at step " + last.step;
      summary.dataset.points = String(steps.length);
    }
  });

  new ResizeObserver(function () { chart.setSize({ width: el.clientWidth, height: 320 }); }).observe(el);
})();
