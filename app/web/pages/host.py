"""The Host page: this server's GPUs now and which run holds each, or its CPU and memory where there is no GPU."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.services import host
from app.web.deps import SessionDep
from app.web.pages import page, templates_of
from app.web.templating import render_block

router = APIRouter(include_in_schema=False)


@router.get("/host", response_class=HTMLResponse)
def host_page(request: Request, db: SessionDep) -> Response:
    """This host's GPUs and the runs holding them; the page polls itself for its `host_now` fragment."""
    context = {"host": host.host_status(db, sampler=request.app.state.host_sampler)}
    if request.headers.get("HX-Target") == "host-now":
        return HTMLResponse(render_block(templates_of(request), "host.html", "host_now", context))
    return page(request, "host.html", context)
