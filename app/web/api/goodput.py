"""Goodput: what share of the time a run held its processes went into training, and where the rest went; and how
much of each step waits on communication."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from rankboard import wire

from app.core.errors import FieldInvalid, RunNotFound
from app.services import comm, goodput, mfu, preflight, sweeps
from app.web.api import documented
from app.web.deps import CallerDep, FoldersDep, LaunchersDep, SessionDep, SettingsDep
from app.web.params import RunId

router = APIRouter(prefix="/api", tags=["runs"])

SinceHours = Annotated[
    float | None, Query(gt=0, le=24 * 3650, description="Runs created in the last this many hours; default: all.")
]
NamePrefix = Annotated[str, Query(max_length=100, description="Runs whose name starts with this; default: all.")]


@router.get("/runs/{run_id}/goodput", response_model=goodput.Goodput, responses=documented(RunNotFound),
            summary="Productive training time over wall time x processes, and the lost time by part")  # fmt: skip
def run_goodput(run_id: RunId, db: SessionDep) -> goodput.Goodput:
    return goodput.goodput_of(db, run_id=run_id)


@router.get("/goodput", response_model=goodput.Goodput,
            summary="Goodput of a set of runs: the last hours, a name prefix (500 newest at most)")  # fmt: skip
def goodput_summary(db: SessionDep, since_hours: SinceHours = None, name_prefix: NamePrefix = "") -> goodput.Goodput:
    return goodput.summary(db, since_hours=since_hours, name_prefix=name_prefix)


@router.get("/runs/{run_id}/comm", response_model=comm.CommShare | None, responses=documented(RunNotFound),
            summary="How much of each step waits on the gradient all-reduce (null: no timings reported)")  # fmt: skip
def run_comm(run_id: RunId, db: SessionDep) -> comm.CommShare | None:
    return comm.comm_share_of(db, run_id=run_id)


@router.get("/runs/{run_id}/preflight", response_model=wire.Preflight | None, responses=documented(RunNotFound),
            summary="The ranks' software and all-reduce bandwidth, compared before training (null: none)")  # fmt: skip
def run_preflight(run_id: RunId, db: SessionDep, folders: FoldersDep) -> wire.Preflight | None:
    return preflight.preflight_of(db, run_id=run_id, folders=folders)


@router.get("/runs/{run_id}/mfu", response_model=mfu.Mfu | None, responses=documented(RunNotFound),
            summary="Model FLOP/s achieved, and MFU against the GPU peak (null: no model FLOPs reported)")  # fmt: skip
def run_mfu(run_id: RunId, db: SessionDep) -> mfu.Mfu | None:
    return mfu.mfu_of(db, run_id=run_id)


@router.post("/runs/{run_id}/sweep", status_code=202, response_model=sweeps.Sweep,
             responses=documented(RunNotFound, FieldInvalid),
             summary="Queue the run's config at 1, 2, 4, ... processes for an epoch each: a scaling sweep")  # fmt: skip
def start_sweep(
    run_id: RunId,
    db: SessionDep,
    settings: SettingsDep,
    folders: FoldersDep,
    launchers: LaunchersDep,
    caller: CallerDep,
) -> sweeps.Sweep:
    return sweeps.start_sweep(db, run_id=run_id, settings=settings, folders=folders, launchers=launchers,
                              actor=caller.name)  # fmt: skip


@router.get("/runs/{run_id}/sweep", response_model=sweeps.Sweep, responses=documented(RunNotFound),
            summary="The run's scaling sweep: throughput, speed-up and efficiency at each size")  # fmt: skip
def run_sweep(run_id: RunId, db: SessionDep) -> sweeps.Sweep:
    return sweeps.sweep_of(db, run_id=run_id)
