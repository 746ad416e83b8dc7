// A plain form's post carries the session's CSRF token as a hidden field. Forms rendered with the page have it
// already; forms that arrive later in live fragments (shared by every viewer of a run) get it here, at submit,
// from the page's <body data-csrf>. htmx requests send it as a header instead (hx-headers on <body>).
document.addEventListener(
  "submit",
  (event) => {
    const token = document.body.dataset.csrf;
    const form = event.target;
    if (!token || !(form instanceof HTMLFormElement) || form.method.toLowerCase() !== "post") return;
    if (form.elements.namedItem("csrf_token")) return;
    const field = document.createElement("input");
    field.type = "hidden";
    field.name = "csrf_token";
    field.value = token;
    form.append(field);
  },
  true,
);
