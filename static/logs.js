// The run page's log panel: follows one rank's stdout or stderr live over its own server-sent event stream.
// The panel arrives by an htmx swap after the page loads; this script starts following once it is there.
// Lines are text nodes (never HTML), and at most MAX_LINES are kept, so a page open for hours stays small.
(function () {
  "use strict";
  const MAX_LINES = 2000;
  const FILTER_DELAY_MS = 300;
  let source = null;
  let filterTimer = null;

  function $(id) { return document.getElementById(id); }

  function choice() {
    const rank = $("log-rank").value;
    const stream = rank === "launcher" ? "stdout" : $("log-stream").value;  // the launcher's output is one file
    return { rank: rank, stream: stream, filter: $("log-filter").value };
  }

  function say(text, state) {
    const status = $("log-status");
    status.textContent = text;
    status.dataset.state = state;
  }

  function describe(c, count) {
    const what = (c.rank === "launcher" ? "the launcher" : "rank " + c.rank) + " · " + c.stream;
    const matching = c.filter ? " matching \u201c" + c.filter + "\u201d" : "";
    return count + " line" + (count === 1 ? "" : "s") + matching + " of " + what;
  }

  function append(lines) {
    const box = $("log-lines");
    const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
    const fragment = document.createDocumentFragment();
    for (const line of lines.slice(-MAX_LINES)) {
      const div = document.createElement("div");
      div.textContent = line;
      fragment.appendChild(div);
    }
    box.appendChild(fragment);
    while (box.childElementCount > MAX_LINES) box.firstElementChild.remove();
    box.dataset.lines = String(box.childElementCount);
    if (atBottom) box.scrollTop = box.scrollHeight;
  }

  function follow() {
    if (source) source.close();
    const section = $("logs");
    const c = choice();
    const run = section.dataset.run;
    $("log-stream").disabled = c.rank === "launcher";
    $("log-download").href = "/api/runs/" + run + "/logs/" + encodeURIComponent(c.rank) + "/" + c.stream + "/download";
    $("log-lines").replaceChildren();
    $("log-lines").dataset.lines = "0";
    say("Waiting for " + describe(c, 0).replace(/^0 lines /, "") + "…", "waiting");
    let note = "";
    source = new EventSource("/runs/" + run + "/logs/stream?" + new URLSearchParams(c));
    source.addEventListener("reset", function (event) {
      const data = JSON.parse(event.data);
      $("log-lines").replaceChildren();
      append(data.lines);
      note = data.budget_hit ? " (only the last 8 MiB were searched)" : "";
      say(describe(c, data.lines.length) + note + " · live", "live");
    });
    source.addEventListener("lines", function (event) {
      append(JSON.parse(event.data));
      say(describe(c, $("log-lines").childElementCount) + note + " · live", "live");
    });
    source.addEventListener("explain", function (event) {
      $("explain").innerHTML = event.data;  // a fragment the server rendered from a template, escaped there
    });
    source.addEventListener("end", function () {
      source.close();
      source = null;
      say(describe(c, $("log-lines").childElementCount) + note + " · the run is over", "ended");
    });
    source.onerror = function () {
      if (source && source.readyState === EventSource.CLOSED) say("Could not follow this log.", "error");
    };
  }

  function start() {
    const section = $("logs");
    if (!section || !$("log-lines")) return;
    // On a phone the panel starts folded, below the charts, unless it explains a failure.
    const box = $("logs-box");
    if (box && !("explained" in box.dataset) && window.matchMedia("(max-width: 640px)").matches) box.open = false;
    section.addEventListener("change", function (event) {
      if (event.target.id === "log-rank" || event.target.id === "log-stream") follow();
    });
    section.addEventListener("input", function (event) {
      if (event.target.id !== "log-filter") return;
      clearTimeout(filterTimer);
      filterTimer = setTimeout(follow, FILTER_DELAY_MS);
    });
    section.addEventListener("click", function (event) {
      const button = event.target.closest("[data-show-rank]");
      if (!button) return;
      $("log-rank").value = button.dataset.showRank;
      $("log-stream").value = button.dataset.showStream;
      follow();
      $("log-lines").scrollIntoView({ block: "nearest" });
    });
    follow();
  }

  document.body.addEventListener("htmx:afterSettle", function (event) {
    if (event.detail.target && event.detail.target.id === "logs") start();
  });
  window.addEventListener("pagehide", function () { if (source) source.close(); });
})();
