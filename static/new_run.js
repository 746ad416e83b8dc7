// The New-run form: a folded group whose options belong to a choice (Slurm's, to "Run on: slurm") unfolds as soon as
// that choice is made, so the options it asks for are in view. The server opens it too when the form comes back so.
(function () {
  "use strict";
  for (const group of document.querySelectorAll("details[data-opened-by]")) {
    const field = document.getElementById("f-" + group.dataset.openedBy);
    if (!field) continue;
    field.addEventListener("change", function () {
      if (field.value === group.dataset.openedValue) group.open = true;
    });
  }
})();
