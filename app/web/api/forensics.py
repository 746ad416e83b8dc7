"""Which rank, and why: ask every rank of a run for its stacks, take their answers, read the verdict."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path

from app.core.errors import FieldInvalid, InvalidToken, RunNotActive, RunNotFound
from app.core.models import Run
from app.schemas.forensics import DumpRequested, DumpsOut, FindingsOut, RankDumpIn
from app.schemas.runs import RunDetail
from app.services import findings as found
from app.services import forensics
from app.web.api import UNREADABLE_BODY, documented
from app.web.api.runs import trainer_token
from app.web.deps import CallerDep, FoldersDep, LaunchersDep, SessionDep, SettingsDep
from app.web.params import RunId

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.post("/{run_id}/dumps", status_code=202, response_model=DumpRequested,
             responses=documented(RunNotFound, RunNotActive),
             summary="Ask every rank of a live run for its stacks and flight recorder")  # fmt: skip
def request_dump(run_id: RunId, db: SessionDep, caller: CallerDep) -> DumpRequested:
    return DumpRequested(request=forensics.request_dump(db, run_id=run_id, actor=caller.name))


@router.get("/{run_id}/dumps", response_model=DumpsOut, responses=documented(RunNotFound),
            summary="The newest dump of every rank, and the rank the others wait for")  # fmt: skip
def latest_dump(run_id: RunId, db: SessionDep, folders: FoldersDep) -> DumpsOut:
    return forensics.run_dump(db, run_id=run_id, folders=folders)


@router.post("/{run_id}/desync", status_code=201, response_model=RunDetail,
             responses=documented(RunNotFound, RunNotActive, FieldInvalid),
             summary="Start a copy of the run with TORCH_DISTRIBUTED_DEBUG=DETAIL and a short timeout")  # fmt: skip
def rerun_with_desync_checks(
    run_id: RunId, db: SessionDep, settings: SettingsDep, folders: FoldersDep, launchers: LaunchersDep,
    caller: CallerDep,
) -> Run:  # fmt: skip
    return forensics.rerun_with_desync_checks(db, run_id=run_id, settings=settings, folders=folders,
                                              launchers=launchers, actor=caller.name)  # fmt: skip


@router.get("/{run_id}/findings", response_model=FindingsOut, responses=documented(RunNotFound),
            summary="What the ranks' reports say went wrong: the first non-finite loss, by step and rank")  # fmt: skip
def findings(run_id: RunId, db: SessionDep) -> FindingsOut:
    return found.run_findings(db, run_id=run_id)


@router.post("/{run_id}/dumps/{request}", status_code=204,
             responses={**documented(InvalidToken, RunNotFound, FieldInvalid), **UNREADABLE_BODY},
             summary="A rank's answer to a dump request (the trainer's client sends it)")  # fmt: skip
def receive_dump(
    run_id: RunId,
    request: Annotated[int, Path(ge=1, le=2**31 - 1, description="The dump request answered.")],
    dump: RankDumpIn,
    db: SessionDep,
    folders: FoldersDep,
    token: Annotated[str, Depends(trainer_token)],
) -> None:
    forensics.receive_dump(db, run_id=run_id, token=token, request=request, dump=dump, folders=folders)
