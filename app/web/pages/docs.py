"""The API's interactive documentation at /docs, from this server's own copy of Swagger UI."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.web.pages import templates_of

router = APIRouter(include_in_schema=False)
SWAGGER_UI = "5.35.0"  # static/vendor/VERSIONS.md


@router.get("/docs", response_class=HTMLResponse)
def api_docs(request: Request) -> HTMLResponse:
    """The API's interactive documentation, from this server's own copy of Swagger UI: clusters often have no
    internet, and FastAPI's default page loads it from a CDN (a blank page there)."""
    # Our own page rather than FastAPI's get_swagger_ui_html: its inline script is refused by the CSP.
    caller = getattr(request.state, "caller", None)
    context = {"openapi_url": request.app.openapi_url, "title": f"{request.app.title} API", "version": SWAGGER_UI,
               "csrf_token": caller.csrf if caller else None}  # fmt: skip
    return templates_of(request).TemplateResponse(request, "docs.html", context)
