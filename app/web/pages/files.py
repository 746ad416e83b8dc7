"""The Files page: the shared folder, browsed; and a checkpoint file's contents, inspected."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.services import checkpoints, storage
from app.web.pages import page
from app.web.params import SharedPath

router = APIRouter(include_in_schema=False)


@router.get("/files", response_class=HTMLResponse)
def files_page(request: Request, path: SharedPath = "") -> Response:
    root = request.app.state.settings.shared
    crumbs = [(part, "/".join(path.split("/")[: i + 1])) for i, part in enumerate(p for p in path.split("/") if p)]
    return page(request, "files.html", {"path": path, "crumbs": crumbs, "entries": storage.list_folder(root, path)})


@router.get("/files/inspect", response_class=HTMLResponse)
def inspect_page(request: Request, path: SharedPath) -> Response:
    inspection = checkpoints.inspect(request.app.state.settings.shared, path)
    return page(request, "inspect.html", {"inspection": inspection, "folder": path.rsplit("/", 1)[0]})
