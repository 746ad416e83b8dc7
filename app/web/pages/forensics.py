"""The run page's "which rank, and why" buttons: dump every rank's stacks, re-run with desync checks."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from app.services import forensics
from app.web.deps import CallerDep, FoldersDep, LaunchersDep, SessionDep, SettingsDep
from app.web.params import RunId

router = APIRouter(include_in_schema=False)


@router.post("/runs/{run_id}/dumps")
def request_dump(run_id: RunId, db: SessionDep, caller: CallerDep) -> Response:
    """The run page's "Dump all ranks": the answers appear in its live status within seconds."""
    forensics.request_dump(db, run_id=run_id, actor=caller.name)
    return RedirectResponse(f"/runs/{run_id}#dump", status_code=303)


@router.post("/runs/{run_id}/desync")
def rerun_with_desync_checks(
    run_id: RunId, db: SessionDep, settings: SettingsDep, folders: FoldersDep, launchers: LaunchersDep,
    caller: CallerDep,
) -> Response:  # fmt: skip
    """ "Re-run with desync checks": a copy of the run that names the rank a collective waits for, then its page."""
    run = forensics.rerun_with_desync_checks(db, run_id=run_id, settings=settings, folders=folders,
                                             launchers=launchers, actor=caller.name)  # fmt: skip
    return RedirectResponse(f"/runs/{run.id}", status_code=303)
