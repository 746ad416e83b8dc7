// The page's theme, light or dark: what this browser chose with the switch in the top bar (kept in localStorage),
// else what the system prefers. Loaded by <head> as a blocking script before the stylesheet, so the page is painted
// in its theme from the first frame; it also carries the runs list's hidden columns (static/runs.js), for the same
// reason. A change (the switch, the system's setting, another tab) sets <html data-theme> and tells the page with a
// "themechange" event, which the charts redraw on.
(function () {
  "use strict";
  const KEY = "rankboard-theme";
  const CHOICES = ["auto", "light", "dark"];
  const system = window.matchMedia("(prefers-color-scheme: dark)");
  const root = document.documentElement;
  let unkept = null;  // the choice made on this page where the browser refuses to keep it

  function stored(key) {
    try { return window.localStorage.getItem(key); } catch (error) { return null; }  // storage may be refused
  }

  function choice() {
    const chosen = stored(KEY) ?? unkept;
    return CHOICES.includes(chosen) ? chosen : "auto";
  }

  function apply() {
    const chosen = choice();
    const theme = chosen === "auto" ? (system.matches ? "dark" : "light") : chosen;
    const changed = root.dataset.theme !== undefined && root.dataset.theme !== theme;
    root.dataset.theme = theme;
    root.dataset.themeChoice = chosen;
    const hidden = stored("rankboard-hidden-columns");
    if (hidden) root.dataset.hideColumns = hidden;
    label();
    if (changed) document.dispatchEvent(new CustomEvent("themechange", { detail: { theme: theme } }));
  }

  function label() {
    const button = document.getElementById("theme-toggle");
    if (!button) return;
    const chosen = choice();
    button.textContent = "Theme: " + (chosen === "auto" ? "auto (" + root.dataset.theme + ")" : chosen);
    button.title = "Light, dark, or as the system says (auto); kept in this browser";
  }

  function next() {
    const chosen = CHOICES[(CHOICES.indexOf(choice()) + 1) % CHOICES.length];
    unkept = chosen;
    try {
      if (chosen === "auto") window.localStorage.removeItem(KEY);
      else window.localStorage.setItem(KEY, chosen);
    } catch (error) { /* not kept: applied to this page only */ }
    apply();
  }

  apply();
  system.addEventListener("change", apply);
  window.addEventListener("storage", (event) => { if (event.key === KEY) apply(); });
  document.addEventListener("DOMContentLoaded", function () {
    const button = document.getElementById("theme-toggle");
    if (!button) return;
    button.hidden = false;
    label();
    button.addEventListener("click", next);
  });
})();
