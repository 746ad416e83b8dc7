"""Runs: tags, notes, archive, delete, one by one or many at once."""

from __future__ import annotations

from fastapi import APIRouter

from app.core.errors import FieldInvalid, RunNotActive, RunNotFound
from app.core.models import Run
from app.schemas.runs import RunDetail
from app.schemas.runs_table import BulkIn, BulkOut, CompareOut, RunDeletionOut, RunLabels
from app.services import compare, run_deletion, runs_table
from app.web.api import UNREADABLE_BODY, documented
from app.web.deps import CallerDep, FoldersDep, SessionDep
from app.web.params import CompareRuns, RunId

router = APIRouter(prefix="/api", tags=["runs"])


@router.patch("/runs/{run_id}", response_model=RunDetail,
              responses={**documented(RunNotFound, FieldInvalid), **UNREADABLE_BODY},
              summary="Set a run's tags (replacing them), notes, or archived mark")  # fmt: skip
def label_run(run_id: RunId, labels: RunLabels, db: SessionDep, caller: CallerDep) -> Run:
    return runs_table.label_run(db, run_id=run_id, tags=labels.tags, notes=labels.notes, archived=labels.archived,
                                 actor=caller.name)  # fmt: skip


@router.delete("/runs/{run_id}", response_model=RunDeletionOut, responses=documented(RunNotFound, RunNotActive),
               summary="Delete a finished run and its metrics (files=true: its own folders too; dry_run tells the "
                       "cost)")  # fmt: skip
def delete_run(
    run_id: RunId, db: SessionDep, folders: FoldersDep, caller: CallerDep, files: bool = False, dry_run: bool = False
) -> RunDeletionOut:
    if dry_run:
        return run_deletion.plan(db, run_id=run_id, folders=folders, files=files)
    return run_deletion.delete_run(db, run_id=run_id, folders=folders, files=files, actor=caller.name)


@router.post("/runs/bulk", response_model=BulkOut,
             responses={**documented(RunNotFound, FieldInvalid), **UNREADABLE_BODY},
             summary="Tag, untag, archive, unarchive or delete many runs")  # fmt: skip
def bulk(body: BulkIn, db: SessionDep, folders: FoldersDep, caller: CallerDep) -> BulkOut:
    if body.action == "delete":
        done, refused = run_deletion.delete_runs(db, run_ids=body.runs, folders=folders, actor=caller.name)
        return BulkOut(done=done, refused={str(k): v for k, v in refused.items()})
    return BulkOut(done=runs_table.bulk(db, run_ids=body.runs, action=body.action, tag=body.tag, actor=caller.name))


@router.get("/compare", response_model=CompareOut, responses=documented(RunNotFound, FieldInvalid),
            summary="2 to 10 runs side by side: each one's summary, their options, their common metrics")  # fmt: skip
def compare_runs(run: CompareRuns, db: SessionDep) -> CompareOut:
    return compare.compare_out(db, run_ids=run)
