"""Runs: create, list, get, stop; their metrics, checkpoints and rank output."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError

from app.core.errors import FieldInvalid, InvalidToken, PathNotFound, RunNotActive, RunNotFound, SeriesNotFound
from app.core.models import Run, RunStatus
from app.schemas.checkpoints import CheckpointOut, CheckpointRemoval, Deletion
from app.schemas.health import HealthOut, RankOut
from app.schemas.logs import RankOutput
from app.schemas.metrics import BatchIn, IngestResult, SeriesOut
from app.schemas.runs import BestMetric, JoinIn, JoinOut, RunCreate, RunDetail, RunPage
from app.services import checkpoints, external, files, health, metrics, nodes, runs, runs_table
from app.services.metrics import Post
from app.store import runs_table_query as run_query
from app.web.api import UNREADABLE_BODY, documented, request_body
from app.web.deps import (
    CallerDep,
    FoldersDep,
    LaunchersDep,
    SessionDep,
    SettingsDep,
)
from app.web.params import (
    ArchivedView,
    CheckpointName,
    CheckpointNames,
    Columns,
    EndStep,
    Filter,
    MetricKey,
    Offset,
    OutputLines,
    RunId,
    RunsLimit,
    Search,
    Sort,
    StartRank,
    StartStep,
)

router = APIRouter(prefix="/api/runs", tags=["runs"])
bearer = HTTPBearer(auto_error=False, description="The per-run token the launcher gives the trainer.")


async def trainer_token(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
    if credentials is None:
        raise InvalidToken("an Authorization: Bearer <token> header is required")
    return credentials.credentials


@router.post("", status_code=201, response_model=RunDetail, responses={**documented(FieldInvalid), **UNREADABLE_BODY},
             summary="Create a run; it starts when it fits")  # fmt: skip
def create_run(
    spec: RunCreate,
    db: SessionDep,
    settings: SettingsDep,
    folders: FoldersDep,
    launchers: LaunchersDep,
    caller: CallerDep,
) -> Run:
    return runs.create_run(
        db, spec=spec, settings=settings, folders=folders, launchers=launchers, actor=caller.name, role=caller.role
    )


@router.post("/external", response_model=JoinOut, responses={**documented(FieldInvalid), **UNREADABLE_BODY},
             summary="A process of a job launched elsewhere joins its job's run (the first one makes it)")  # fmt: skip
def join_external(spec: JoinIn, db: SessionDep, folders: FoldersDep, caller: CallerDep) -> JoinOut:
    return external.join(db, spec=spec, shared=folders.shared, actor=caller.name)


@router.get("", response_model=RunPage, responses=documented(FieldInvalid),
            summary="List runs: search, filter on options and metrics, sort, extra columns")  # fmt: skip
def list_runs(
    db: SessionDep,
    status: RunStatus | None = None,
    limit: RunsLimit = 50,
    offset: Offset = 0,
    q: Search = "",
    filter: Filter = "",
    sort: Sort = "-id",
    columns: Columns = "",
    archived: ArchivedView = "hide",
) -> RunPage:
    view = run_query.parse(search=q, filter=filter, sort=sort, columns=columns, archived=archived, status=status)
    table = runs_table.page(db, query=view, limit=limit, offset=offset)
    values = {str(run_id): row for run_id, row in table.values.items()}
    body = {"items": table.runs, "total": table.total, "limit": limit, "offset": offset,
            "columns": [c.label for c in view.columns], "values": values}  # fmt: skip
    return RunPage.model_validate(body, from_attributes=True)


@router.get("/{run_id}", response_model=RunDetail, responses=documented(RunNotFound),
            summary="One run, with its lifecycle events")  # fmt: skip
def get_run(run_id: RunId, db: SessionDep) -> Run:
    return runs.get_run(db, run_id=run_id)


@router.get("/{run_id}/health", response_model=HealthOut, responses=documented(RunNotFound),
            summary="Is a running run progressing: stalled ranks; GPUs spinning in a hung collective")  # fmt: skip
def run_health(run_id: RunId, db: SessionDep, settings: SettingsDep) -> HealthOut:
    return health.run_health(db, run_id=run_id, stall_after_s=settings.stall_after_s)


@router.get("/{run_id}/ranks", response_model=list[RankOut], responses=documented(RunNotFound),
            summary="Each rank's last heartbeat: its host, step and time")  # fmt: skip
def run_ranks(run_id: RunId, db: SessionDep) -> list[RankOut]:
    return nodes.ranks(db, run_id=run_id)


@router.post("/{run_id}/stop", status_code=202, response_model=RunDetail,
             responses=documented(RunNotFound, RunNotActive), summary="Stop a run gracefully")  # fmt: skip
def stop_run(run_id: RunId, db: SessionDep, launchers: LaunchersDep, caller: CallerDep) -> Run:
    return runs.stop_run(db, run_id=run_id, launchers=launchers, actor=caller.name)


@router.post("/{run_id}/resume", status_code=202, response_model=RunDetail,
             responses=documented(RunNotFound, RunNotActive),
             summary="Resume a stopped, failed or lost run from its newest snapshot, as the same run")  # fmt: skip
def resume_run(run_id: RunId, db: SessionDep, folders: FoldersDep, caller: CallerDep) -> Run:
    return runs.resume_run(db, run_id=run_id, folders=folders, actor=caller.name)


@router.get("/{run_id}/metrics", responses=documented(RunNotFound), summary="The metric keys a run has reported")
def metric_keys(run_id: RunId, db: SessionDep) -> list[str]:
    return metrics.series_keys(db, run_id=run_id)


def parse_batch(body: bytes) -> BatchIn:
    """The batch, parsed and checked straight from the body's bytes: for 10,000 points in the compact format that is
    ~6x faster than FastAPI's json.loads followed by a check of the Python objects (bench/ingest.py)."""
    try:
        return BatchIn.model_validate_json(body)
    except ValidationError as error:
        if not _is_utf8(body):  # its errors would quote the bytes, which JSON cannot carry: the 400 of other routes
            raise HTTPException(400, "There was an error parsing the body: it is not UTF-8 text") from None
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in error.errors(include_url=False)]
        ) from None


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode()
    except UnicodeDecodeError:
        return False
    return True


@router.post("/{run_id}/metrics", response_model=IngestResult,
             responses={**documented(InvalidToken, RunNotFound, RunNotActive), **UNREADABLE_BODY},
             openapi_extra=request_body(BatchIn), summary="Ingest a trainer's batch (idempotent)")  # fmt: skip
async def ingest(run_id: RunId, request: Request, token: Annotated[str, Depends(trainer_token)]) -> Response:
    """Parsed on the ingest threads (app.workers.ingest_threads), which queue it for the ingest writer: it stores the
    batches that came meanwhile in one transaction (app.workers.ingest_writer); both may yield the CPU to training.
    Every rank posts here each second or two, so the route asks FastAPI for nothing it can take from the app itself:
    each dependency, and the check of a returned model, cost the event loop's thread CPU at every post
    (bench/post_cost.py)."""
    state, body, sender = request.app.state, await request.body(), request.client
    stored = await state.ingest_threads.run(
        lambda: state.ingest_writer.submit(Post(run_id, token, parse_batch(body)), sender=sender)
    )
    result = await asyncio.wrap_future(stored)
    return Response(result.model_dump_json(exclude_defaults=True), media_type="application/json")


# The CSV a series is answered in besides JSON, for the OpenAPI document.
SERIES_CSV = {
    "description": "A page of JSON, or the range as CSV: a header, then one line per point.",
    "content": {"text/csv": {"schema": {"type": "string"}, "example": "step,rank,value,time\n0,0,2.5,1763000000.25\n"}},
}


@router.get("/{run_id}/metrics/{key:path}", response_model=SeriesOut,
            responses={**documented(RunNotFound, SeriesNotFound), 200: SERIES_CSV},
            summary="A metric series by step range, as JSON pages or CSV")  # fmt: skip
def read_series(
    run_id: RunId,
    key: MetricKey,
    db: SessionDep,
    request: Request,
    start_step: StartStep = 0,
    start_rank: StartRank = 0,
    end_step: EndStep = None,
    limit: Annotated[int | None, Query(ge=1, le=100_000, description="Points on a JSON page (default 10,000); "
                                       "in CSV at most this many (default: every point of the range).")] = None,
    output: Annotated[Literal["json", "csv"] | None, Query(alias="format", description="json or csv; default: the "
                                                           "Accept header's choice (text/csv), else json.")] = None,
) -> SeriesOut | StreamingResponse:  # fmt: skip
    """JSON pages by default; CSV with `?format=csv` or `Accept: text/csv`: `step,rank,value,time` rows, streamed."""
    if (output or _accepted(request.headers.get("accept", ""))) == "csv":
        lines = metrics.series_csv(request.app.state.sessions, run_id=run_id, key=key, start_step=start_step,
                                   start_rank=start_rank, end_step=end_step, limit=limit)  # fmt: skip
        return StreamingResponse(lines, media_type="text/csv; charset=utf-8")
    return metrics.read_series(db, run_id=run_id, key=key, start_step=start_step, start_rank=start_rank,
                               end_step=end_step, limit=limit or 10_000)  # fmt: skip


def _accepted(accept: str) -> str:
    """`csv` when the Accept header prefers text/csv to JSON (a higher q, or JSON not named), else `json`."""
    quality = {}
    for entry in accept.split(","):
        media, *params = (part.strip() for part in entry.split(";"))
        q = next((param[2:] for param in params if param.startswith("q=")), "1")
        quality[media.lower()] = float(q) if q.replace(".", "", 1).isdigit() else 0.0
    return "csv" if quality.get("text/csv", 0.0) > quality.get("application/json", 0.0) else "json"


@router.get("/{run_id}/checkpoints", response_model=list[CheckpointOut], responses=documented(RunNotFound),
            summary="A run's checkpoints")  # fmt: skip
def list_checkpoints(
    run_id: RunId, db: SessionDep, folders: FoldersDep, best_metric: BestMetric = "loss"
) -> list[CheckpointOut]:
    run = runs.get_run(db, run_id=run_id)
    return checkpoints.list_checkpoints(run, folders=folders, best_metric=best_metric)


@router.get("/{run_id}/checkpoints/removed", response_model=list[CheckpointRemoval],
            responses=documented(RunNotFound), summary="Checkpoints the run's retention policy deleted")  # fmt: skip
def removed_checkpoints(run_id: RunId, db: SessionDep, folders: FoldersDep) -> list[CheckpointRemoval]:
    return checkpoints.removals(runs.get_run(db, run_id=run_id), folders=folders)


# After /removed: otherwise {name} would take "removed".
@router.get("/{run_id}/checkpoints/{name}", response_model=CheckpointOut,
            responses=documented(RunNotFound, PathNotFound), summary="One checkpoint's metadata")  # fmt: skip
def get_checkpoint(
    run_id: RunId, name: CheckpointName, db: SessionDep, folders: FoldersDep, best_metric: BestMetric = "loss"
) -> CheckpointOut:
    run = runs.get_run(db, run_id=run_id)
    return checkpoints.get_checkpoint(run, name=name, folders=folders, best_metric=best_metric)


@router.delete("/{run_id}/checkpoints", response_model=Deletion,
               responses=documented(RunNotFound, PathNotFound, RunNotActive),
               summary="Delete checkpoints (dry_run tells the cost)")  # fmt: skip
def delete_checkpoints(
    run_id: RunId,
    db: SessionDep,
    folders: FoldersDep,
    caller: CallerDep,
    name: CheckpointNames = None,
    dry_run: bool = False,
) -> Deletion:
    _run, deletion = checkpoints.delete_run_checkpoints(
        db, run_id=run_id, names=name, dry_run=dry_run, folders=folders, actor=caller.name
    )
    return deletion


@router.get("/{run_id}/output", responses=documented(RunNotFound),
            summary="The last lines of each rank's stdout and stderr")  # fmt: skip
def rank_output(run_id: RunId, db: SessionDep, folders: FoldersDep, lines: OutputLines = 50) -> list[RankOutput]:
    return files.rank_outputs(runs.get_run(db, run_id=run_id), folders=folders, lines=lines)
