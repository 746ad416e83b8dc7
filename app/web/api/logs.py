"""A run's logs over the API: the files, their last lines (filtered), a whole file, and the failures explained."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response, StreamingResponse

from app.core.errors import PathNotFound, RunNotFound
from app.schemas.logs import DiagnosisOut, LogFileOut, TailOut
from app.services import logs, runs
from app.web.api import documented
from app.web.deps import FoldersDep, SessionDep
from app.web.params import LogFilter, LogLines, LogRank, LogStream, RunId

router = APIRouter(prefix="/api/runs", tags=["logs"])


A_LOG = {
    "description": "The whole file, as it was when asked for.",
    "content": {"text/plain": {"schema": {"type": "string"}}},
}


@router.get("/{run_id}/logs", response_model=list[LogFileOut], responses=documented(RunNotFound),
            summary="A run's log files: each rank's, and torchrun's or Slurm's")  # fmt: skip
def list_logs(run_id: RunId, db: SessionDep, folders: FoldersDep) -> list[LogFileOut]:
    files = logs.log_files(runs.get_run(db, run_id=run_id), folders=folders)
    return [
        LogFileOut(rank=f.rank, stream=f.stream, size=f.size, attempt=f.attempt, rank_guessed=f.rank_guessed,
                   url=_url(run_id, f))
        for f in files
    ]  # fmt: skip


def _url(run_id: int, file: logs.LogFile) -> str:
    return f"/api/runs/{run_id}/logs/{file.rank_name}/{file.stream}"


@router.get("/{run_id}/logs/{rank}/{stream}", response_model=TailOut, responses=documented(RunNotFound, PathNotFound),
            summary="The last lines of a log, filtered")  # fmt: skip
def tail_log(
    run_id: RunId,
    rank: LogRank,
    stream: LogStream,
    db: SessionDep,
    folders: FoldersDep,
    lines: LogLines = 200,
    filter: LogFilter = "",
) -> TailOut:
    run = runs.get_run(db, run_id=run_id)
    found = logs.tail_log(run, folders=folders, rank=rank, stream=stream, lines=lines, filter=filter)
    return TailOut(rank=logs.parse_rank(rank), stream=stream, size=found.size, lines=found.lines,
                   scanned=found.scanned, budget_hit=found.budget_hit)  # fmt: skip


@router.get("/{run_id}/logs/{rank}/{stream}/download", response_class=Response,
            responses={**documented(RunNotFound, PathNotFound), 200: A_LOG},
            summary="A whole log file, as an attachment")  # fmt: skip
def download_log(
    run_id: RunId, rank: LogRank, stream: LogStream, db: SessionDep, folders: FoldersDep
) -> StreamingResponse:
    file = logs.log_file(runs.get_run(db, run_id=run_id), folders=folders, rank=rank, stream=stream)
    headers = {
        "Content-Disposition": f'attachment; filename="run-{run_id}-{file.rank_name}-{stream}.log"',
        "Content-Length": str(file.size),
    }
    return StreamingResponse(logs.download(file), media_type="text/plain; charset=utf-8", headers=headers)


@router.get("/{run_id}/diagnoses", response_model=list[DiagnosisOut], responses=documented(RunNotFound),
            summary="What went wrong, read from the logs")  # fmt: skip
def diagnoses(run_id: RunId, db: SessionDep, folders: FoldersDep) -> list[DiagnosisOut]:
    return logs.diagnoses(runs.get_run(db, run_id=run_id), folders=folders)
