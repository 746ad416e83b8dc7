// The runs list's column picker: which of the table's own columns this browser shows, kept in localStorage and set
// on <html data-hide-columns> (static/theme.js sets it again before the next page paints, so a hidden column never
// flashes); app.css hides the cells of each column named there. Without this script every column shows.
(function () {
  "use strict";
  const KEY = "rankboard-hidden-columns";
  const picker = document.getElementById("column-picker");
  if (!picker) return;
  const root = document.documentElement;

  function hidden() {
    return (root.dataset.hideColumns || "").split(" ").filter(Boolean);
  }

  function keep(names) {
    const text = names.join(" ");
    if (text) root.dataset.hideColumns = text;
    else delete root.dataset.hideColumns;
    try {
      if (text) window.localStorage.setItem(KEY, text);
      else window.localStorage.removeItem(KEY);
    } catch (error) { /* not kept: this page only */ }
  }

  const boxes = Array.from(picker.querySelectorAll("input[type=checkbox]"));
  for (const box of boxes) box.checked = !hidden().includes(box.value);
  picker.addEventListener("change", function () {
    keep(boxes.filter((box) => !box.checked).map((box) => box.value));
  });
  picker.hidden = false;
})();
