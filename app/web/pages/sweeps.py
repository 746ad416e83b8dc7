"""The run page's "Scaling sweep" button: its config queued at 1, 2, 4, ... processes; the table shows on its page."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from app.services import sweeps
from app.web.deps import CallerDep, FoldersDep, LaunchersDep, SessionDep, SettingsDep
from app.web.params import RunId

router = APIRouter(include_in_schema=False)


@router.post("/runs/{run_id}/sweep")
def start_sweep(
    run_id: RunId,
    db: SessionDep,
    settings: SettingsDep,
    folders: FoldersDep,
    launchers: LaunchersDep,
    caller: CallerDep,
) -> Response:
    sweeps.start_sweep(db, run_id=run_id, settings=settings, folders=folders, launchers=launchers, actor=caller.name)
    return RedirectResponse(f"/runs/{run_id}#sweep", status_code=303)
