"""Scaling sweeps: a run's config at 1, 2, 4, ... processes for an epoch each, and what each size bought."""

from __future__ import annotations

from fastapi import APIRouter

from app.core.errors import FieldInvalid, RunNotFound
from app.schemas.sweeps import Sweep
from app.services import sweeps
from app.web.api import documented
from app.web.deps import CallerDep, FoldersDep, LaunchersDep, SessionDep, SettingsDep
from app.web.params import RunId

router = APIRouter(prefix="/api", tags=["runs"])


@router.post("/runs/{run_id}/sweep", status_code=202, response_model=Sweep,
             responses=documented(RunNotFound, FieldInvalid),
             summary="Queue the run's config at 1, 2, 4, ... processes for an epoch each: a scaling sweep")  # fmt: skip
def start_sweep(
    run_id: RunId,
    db: SessionDep,
    settings: SettingsDep,
    folders: FoldersDep,
    launchers: LaunchersDep,
    caller: CallerDep,
) -> Sweep:
    return sweeps.start_sweep(db, run_id=run_id, settings=settings, folders=folders, launchers=launchers,
                              actor=caller.name)  # fmt: skip


@router.get("/runs/{run_id}/sweep", response_model=Sweep, responses=documented(RunNotFound),
            summary="The run's scaling sweep: throughput, speed-up and efficiency at each size")  # fmt: skip
def run_sweep(run_id: RunId, db: SessionDep) -> Sweep:
    return sweeps.sweep_of(db, run_id=run_id)
