"""The HTML pages, by the same subjects as the API; here, what every page shares: its frame and the posted form."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Header, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from app.services import storage


def templates_of(request: Request) -> Jinja2Templates:
    return request.app.state.templates


def page(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200, headers: dict[str, str] | None = None
) -> HTMLResponse:
    """A whole page: the template with what every page's frame shows (the shared folder, its disk, the caller)."""
    settings = request.app.state.settings
    caller = getattr(request.state, "caller", None)  # None on the public pages: the login page, a refusal
    base = {"settings": settings, "shared_dir": settings.shared, "shared_fallback": settings.shared_dir_is_fallback,
            "disk": storage.disk_usage(settings.shared), "caller": caller,
            "csrf_token": caller.csrf if caller else None}  # fmt: skip
    return templates_of(request).TemplateResponse(
        request, name, {**base, **context}, status_code=status_code, headers=headers
    )


async def form_values(request: Request) -> dict[str, str]:
    """The posted form as strings, kept on the request so a field error can re-render the form with them."""
    values = {key: str(value) for key, value in (await request.form()).items()}
    request.state.form_values = values
    return values


FormValues = Annotated[dict[str, str], Depends(form_values)]
HtmxRequest = Annotated[str | None, Header(alias="HX-Request")]
