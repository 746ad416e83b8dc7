"""The runs pages: the runs list, the new-run form, a run's page with its live stream and its verbs (stop, resume,
delete checkpoints); and the error page every page falls back on. Each route calls one service."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from app.core.errors import FieldInvalid, FormInvalid, LoginThrottled, RankboardError
from app.core.models import RunStatus
from app.launcher.launchers import Launchers, kind
from app.schemas.runs import RunCreate
from app.services import checkpoints, health, metrics, runs, runs_table
from app.services.run_page import RunPageView, run_page_view
from app.store import runs_table_query as run_query
from app.web.deps import CallerDep, FoldersDep, LaunchersDep, SessionDep, SettingsDep
from app.web.forms import form_values_like, like_refusal, parse_run_form, run_form_groups
from app.web.pages import FormValues, HtmxRequest, page, templates_of
from app.web.params import (
    After,
    ArchivedView,
    CheckpointNames,
    Columns,
    Filter,
    FromRun,
    InitFrom,
    LastEventId,
    PageNumber,
    RunId,
    Search,
    Sort,
)
from app.web.stream import Fragments, Snapshot, run_events
from app.web.templating import render_block

router = APIRouter(include_in_schema=False)
PAGE_SIZE = 25


@router.get("/", response_class=HTMLResponse)
def runs_page(
    request: Request,
    db: SessionDep,
    status: RunStatus | None = None,
    page_number: PageNumber = 1,
    q: Search = "",
    filter: Filter = "",
    sort: Sort = "-id",
    columns: Columns = "",
    archived: ArchivedView = "hide",
) -> Response:
    """The runs table: search, conditions, sort and columns from the URL, so a view can be shared."""
    offset = (page_number - 1) * PAGE_SIZE  # PageNumber is at least 1
    settings = request.app.state.settings
    view = run_query.parse(search=q, filter=filter, sort=sort, columns=columns, archived=archived, status=status)
    table = runs_table.page(db, query=view, limit=PAGE_SIZE, offset=offset)
    items, total = table.runs, table.total
    context = {
        "runs": items,
        "table": table,
        "view": run_query.as_params(view),
        "any_status": {key: value for key, value in run_query.as_params(view).items() if key != "status"},
        "fields": run_query.FIELDS,
        "durations": {run.id: runs.elapsed(run) for run in items},  # None until started; up to now while live
        "stalled": {run.id for run in items if health.not_progressing(db, run, stall_after_s=settings.stall_after_s)},
        "total": total,
        "status": status,
        "page_number": page_number,
        "pages": max(1, -(-total // PAGE_SIZE)),
        "statuses": list(RunStatus),
        "demo": RunCreate(),
    }
    if request.headers.get("HX-Target") == "runs-table":
        return HTMLResponse(render_block(templates_of(request), "runs.html", "runs_table", context))
    return page(request, "runs.html", context)


@router.get("/runs/new", response_class=HTMLResponse)
def new_run_page(
    request: Request, db: SessionDep, launchers: LaunchersDep, from_run: FromRun = None, init_from: InitFrom = ""
) -> Response:
    """The form; `from_run` fills it with that run's options, `init_from` names a checkpoint to start from."""
    values = form_values_like(runs.get_run(db, run_id=from_run)) if from_run is not None else {}
    if init_from:
        values.update(init_from=init_from, name=f"{values.get('name', 'run')} from {init_from.rsplit('/', 1)[-1]}")
    return new_run_form(request, launchers=launchers, values=values, errors={})


def new_run_form(
    request: Request, *, launchers: Launchers, values: dict[str, str], errors: dict[str, str], status_code: int = 200
) -> HTMLResponse:
    local = launchers.local
    # The cluster's partitions, from sinfo; an empty list where Slurm does not answer (the form still offers it).
    partitions = None if launchers.slurm is None else (launchers.slurm.partitions() or {})
    context = {
        "groups": run_form_groups(capacity=local.capacity, partitions=partitions),
        "values": values,
        "errors": errors,
        "capacity": local.capacity,
        "gpu_count": local.gpu_count,
        "slurm": launchers.slurm is not None,
    }
    return page(request, "new_run.html", context, status_code=status_code)


@router.post("/runs")
def create_run(
    db: SessionDep,
    settings: SettingsDep,
    folders: FoldersDep,
    launchers: LaunchersDep,
    values: FormValues,
    caller: CallerDep,
) -> Response:
    spec = parse_run_form(values)
    run = runs.create_run(db, spec=spec, settings=settings, folders=folders, launchers=launchers, actor=caller.name)
    return RedirectResponse(f"/runs/{run.id}", status_code=303)


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: RunId, db: SessionDep, folders: FoldersDep, settings: SettingsDep) -> Response:
    """The run page; its `charts` fragment alone for the page's script when a new metric key arrives."""
    view = run_page_view(db, run_id=run_id, folders=folders, settings=settings)
    if request.headers.get("HX-Target") == "charts":
        return HTMLResponse(render_block(templates_of(request), "run.html", "charts", view_context(view)))
    return page(request, "run.html", view_context(view))


@router.post("/runs/{run_id}/stop")
def stop_run(
    request: Request,
    run_id: RunId,
    db: SessionDep,
    launchers: LaunchersDep,
    folders: FoldersDep,
    settings: SettingsDep,
    caller: CallerDep,
    hx: HtmxRequest = None,
) -> Response:
    runs.stop_run(db, run_id=run_id, launchers=launchers, actor=caller.name)
    if hx:
        view = run_page_view(db, run_id=run_id, folders=folders, settings=settings)
        return HTMLResponse(render_block(templates_of(request), "run.html", "status", view_context(view)))
    return RedirectResponse(f"/runs/{run_id}", status_code=303)


@router.post("/runs/{run_id}/resume")
def resume_run(run_id: RunId, db: SessionDep, folders: FoldersDep, caller: CallerDep) -> Response:
    runs.resume_run(db, run_id=run_id, folders=folders, actor=caller.name)
    return RedirectResponse(f"/runs/{run_id}", status_code=303)


@router.delete("/runs/{run_id}/checkpoints", response_class=HTMLResponse)
def delete_checkpoints(
    request: Request,
    run_id: RunId,
    db: SessionDep,
    folders: FoldersDep,
    settings: SettingsDep,
    caller: CallerDep,
    name: CheckpointNames = None,
) -> Response:
    checkpoints.delete_run_checkpoints(db, run_id=run_id, names=name, dry_run=False, folders=folders, actor=caller.name)
    view = run_page_view(db, run_id=run_id, folders=folders, settings=settings)
    return HTMLResponse(render_block(templates_of(request), "run.html", "files", view_context(view)))


@router.get("/runs/{run_id}/stream")
def run_stream(
    request: Request,
    run_id: RunId,
    after: After = 0,
    last_event_id: LastEventId = None,
) -> StreamingResponse:
    """New points, status and output of a run; from `after`, or on a reconnect from the last point received."""
    # No request-long session: an SSE connection lasts hours, and an open read transaction would keep SQLite
    # from checkpointing its WAL all that time. Each poll opens and closes its own.
    with request.app.state.sessions() as session:
        runs.get_run(session, run_id=run_id)  # a 404 now, rather than a stream that ends at once

    def snapshot(after_id: int) -> Snapshot:
        # The fragments first: a run seen final has stored its last point, so the points read after it are all.
        fragments = request.app.state.run_fragments.get(run_id, lambda: run_fragments(request, run_id))
        with request.app.state.sessions() as session:
            return Snapshot(metrics.new_points(session, run_id=run_id, after_id=after_id), fragments)

    after_id = after if last_event_id is None else last_event_id
    events = run_events(request, run_id=run_id, after_id=after_id, snapshot=snapshot)
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-store"})


def run_fragments(request: Request, run_id: int) -> Fragments:
    """The run page's live fragments, as its stream sends them."""
    state = request.app.state
    with state.sessions() as session:
        view = run_page_view(session, run_id=run_id, folders=state.folders, settings=state.settings)
    context = view_context(view)  # rendered with the session closed: the view needs no database
    return Fragments(
        render_block(state.templates, "run.html", "status", context),
        render_block(state.templates, "run.html", "files", context),
        render_block(state.templates, "run.html", "output", context),
        view.run.status.is_final,
    )


def view_context(view: RunPageView) -> dict[str, Any]:
    """run.html's context: the view, and its run by the short name every part of the page reads it by."""
    return {
        "view": view,
        "run": view.run,
        "launcher": kind(view.run.launcher),  # what its kind of run offers
        "like_refusal": like_refusal(view.run),  # why "New run like this" is not offered; None where it is
    }


def error_page(request: Request, exc: RankboardError) -> Response:
    """A domain error as the form again (field errors on a form post; a failed login), an htmx fragment, or a page."""
    values = getattr(request.state, "form_values", None)
    if request.url.path == "/login" and values is not None:
        context = {"next": values.get("next", "/"), "name": values.get("name", ""), "error": exc.message}
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, LoginThrottled) else {}
        return page(request, "login.html", context, exc.status_code, headers=headers)
    if values is not None and isinstance(exc, (FormInvalid, FieldInvalid)):
        errors = exc.errors if isinstance(exc, FormInvalid) else {exc.field: exc.message}
        launchers = request.app.state.launchers
        return new_run_form(request, launchers=launchers, values=values, errors=errors, status_code=422)
    context = {"message": exc.message, "status_code": exc.status_code}
    if request.headers.get("HX-Request"):
        fragment = render_block(templates_of(request), "error.html", "message", context)
        return HTMLResponse(fragment, status_code=exc.status_code)
    return page(request, "error.html", context, exc.status_code)
