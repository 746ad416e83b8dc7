"""Runs: create, list, get, stop; their metrics, checkpoints and rank output."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.deps import LauncherDep, SessionDep, SettingsDep
from app.errors import InvalidToken
from app.models import Run, RunStatus
from app.schemas import (
    BatchIn,
    BestMetric,
    CheckpointOut,
    CheckpointRemoval,
    Deletion,
    HealthOut,
    IngestResult,
    RunCreate,
    RunDetail,
    RunPage,
    SeriesOut,
)
from app.services import checkpoints, files, health, metrics, runs

router = APIRouter(prefix="/api/runs", tags=["runs"])
bearer = HTTPBearer(auto_error=False, description="The per-run token the launcher gives the trainer.")


async def trainer_token(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
    if credentials is None:
        raise InvalidToken("an Authorization: Bearer <token> header is required")
    return credentials.credentials


@router.post("", status_code=201, response_model=RunDetail, summary="Create a run; it starts when it fits")
def create_run(spec: RunCreate, db: SessionDep, launcher: LauncherDep) -> Run:
    return runs.create_run(db, spec=spec, launcher=launcher)


@router.get("", response_model=RunPage, summary="List runs, newest first")
def list_runs(
    db: SessionDep,
    status: RunStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> RunPage:
    items, total = runs.list_runs(db, status=status, limit=limit, offset=offset)
    return RunPage.model_validate(
        {"items": items, "total": total, "limit": limit, "offset": offset}, from_attributes=True
    )


@router.get("/{run_id}", response_model=RunDetail, summary="One run, with its lifecycle events")
def get_run(run_id: int, db: SessionDep) -> Run:
    return runs.get_run(db, run_id=run_id)


@router.get("/{run_id}/health", response_model=HealthOut,
            summary="Is a running run progressing: stalled ranks; GPUs spinning in a hung collective")  # fmt: skip
def run_health(run_id: int, db: SessionDep, settings: SettingsDep) -> health.Health:
    return health.run_health(db, run_id=run_id, stall_after_s=settings.stall_after_s)


@router.post("/{run_id}/stop", status_code=202, response_model=RunDetail, summary="Stop a run gracefully")
def stop_run(run_id: int, db: SessionDep, launcher: LauncherDep) -> Run:
    return runs.stop_run(db, run_id=run_id, launcher=launcher)


@router.post("/{run_id}/resume", status_code=202, response_model=RunDetail,
             summary="Resume a stopped, failed or lost run from its newest snapshot, as the same run")  # fmt: skip
def resume_run(run_id: int, db: SessionDep, launcher: LauncherDep) -> Run:
    return runs.resume_run(db, run_id=run_id, launcher=launcher)


@router.get("/{run_id}/metrics", summary="The metric keys a run has reported")
def metric_keys(run_id: int, db: SessionDep) -> list[str]:
    return metrics.series_keys(db, run_id=run_id)


@router.post("/{run_id}/metrics", response_model=IngestResult, summary="Ingest a trainer's batch (idempotent)")
def ingest(run_id: int, batch: BatchIn, db: SessionDep, token: Annotated[str, Depends(trainer_token)]) -> IngestResult:
    return metrics.ingest(db, run_id=run_id, token=token, batch=batch)


@router.get("/{run_id}/metrics/{key:path}", response_model=SeriesOut, summary="A metric series by step range")
def read_series(
    run_id: int,
    key: str,
    db: SessionDep,
    start_step: Annotated[int, Query(ge=0)] = 0,
    end_step: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> SeriesOut:
    return metrics.read_series(db, run_id=run_id, key=key, start_step=start_step, end_step=end_step, limit=limit)


@router.get("/{run_id}/checkpoints", response_model=list[CheckpointOut], summary="A run's checkpoints")
def list_checkpoints(
    run_id: int, db: SessionDep, launcher: LauncherDep, best_metric: BestMetric = "loss"
) -> list[CheckpointOut]:
    run = runs.get_run(db, run_id=run_id)
    return checkpoints.list_checkpoints(run, launcher=launcher, best_metric=best_metric)


@router.get("/{run_id}/checkpoints/removed", response_model=list[CheckpointRemoval],
            summary="Checkpoints the run's retention policy deleted")  # fmt: skip
def removed_checkpoints(run_id: int, db: SessionDep, launcher: LauncherDep) -> list[CheckpointRemoval]:
    return checkpoints.removals(runs.get_run(db, run_id=run_id), launcher=launcher)


# After /removed: otherwise {name} would take "removed".
@router.get("/{run_id}/checkpoints/{name}", response_model=CheckpointOut, summary="One checkpoint's metadata")
def get_checkpoint(
    run_id: int, name: str, db: SessionDep, launcher: LauncherDep, best_metric: BestMetric = "loss"
) -> CheckpointOut:
    run = runs.get_run(db, run_id=run_id)
    return checkpoints.get_checkpoint(run, name=name, launcher=launcher, best_metric=best_metric)


@router.delete("/{run_id}/checkpoints", response_model=Deletion, summary="Delete checkpoints (dry_run tells the cost)")
def delete_checkpoints(
    run_id: int,
    db: SessionDep,
    launcher: LauncherDep,
    name: Annotated[list[str] | None, Query(description="Checkpoint file names; none means all.")] = None,
    dry_run: bool = False,
) -> Deletion:
    run = runs.get_run(db, run_id=run_id)
    return checkpoints.delete_checkpoints(run, names=name, dry_run=dry_run, launcher=launcher)


@router.get("/{run_id}/output", summary="The last lines of each rank's stdout and stderr")
def rank_output(
    run_id: int, db: SessionDep, launcher: LauncherDep, lines: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[files.RankOutput]:
    return files.rank_outputs(runs.get_run(db, run_id=run_id), launcher=launcher, lines=lines)
