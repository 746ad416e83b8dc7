// The API's Swagger UI, started from this file rather than an inline script: the Content-Security-Policy lets this
// server's pages run only its own script files. "Try it out" sends the session's CSRF token, as the pages do.
const body = document.body;
window.ui = SwaggerUIBundle({
  url: body.dataset.openapi,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  requestInterceptor: (request) => {
    if (body.dataset.csrf) request.headers["X-CSRF-Token"] = body.dataset.csrf;
    return request;
  },
});
