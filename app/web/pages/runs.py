"""The runs pages: the runs list, the new-run form, a run's page with its live stream and its verbs (stop, resume,
delete checkpoints); and the error page every page falls back on. Each route calls one service."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from sqlalchemy.orm import Session

from app.core.errors import FieldInvalid, FormInvalid, LoginThrottled, RankboardError
from app.core.models import RunStatus
from app.launcher.interface import Launcher
from app.launcher.launchers import Launchers, kind
from app.schemas.runs import RunCreate
from app.services import checkpoints, health, metrics, queue, runs, runs_table, scripts
from app.services.metrics import LivePoints
from app.services.run_page import RunPageView, run_is_over, run_page_view
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
    StreamParts,
    Watch,
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
    """The runs table: search, conditions, sort and columns from the URL, so a view can be shared. A box the view
    cannot take is said at the box (a 422), and the table shows the view without it."""
    offset = (page_number - 1) * PAGE_SIZE  # PageNumber is at least 1
    settings = request.app.state.settings
    asked = {"q": q, "filter": filter, "sort": sort, "columns": columns}
    table, errors = _runs_table(db, asked, archived=archived, status=status, offset=offset)
    items, total = table.runs, table.total
    context = {
        "runs": items,
        "table": table,
        "view": run_query.as_params(table.query),
        "asked": asked,
        "errors": errors,
        "any_status": {key: value for key, value in run_query.as_params(table.query).items() if key != "status"},
        "fields": run_query.FIELDS,
        "hideable": HIDEABLE,
        "durations": {run.id: runs.elapsed(run) for run in items},  # None until started; up to now while live
        "stalled": {run.id for run in items if health.not_progressing(db, run, stall_after_s=settings.stall_after_s)},
        # Each queued run's place in this host's queue, for its badge; read only when the page shows a queued run.
        "queue_places": queue.positions(db, launchers=request.app.state.launchers, settings=settings)
        if any(run.status == RunStatus.queued for run in items)
        else {},
        "total": total,
        "status": status,
        "page_number": page_number,
        "pages": max(1, -(-total // PAGE_SIZE)),
        "statuses": list(RunStatus),
        "demo": RunCreate(),
    }
    code = 422 if errors else 200
    if request.headers.get("HX-Target") == "runs-table":
        return HTMLResponse(render_block(templates_of(request), "runs.html", "runs_table", context), status_code=code)
    return page(request, "runs.html", context, status_code=code)


# The runs table's columns a user may hide (the picker keeps the choice per browser), by the name app.css hides.
HIDEABLE = (("tags", "Tags"), ("workload", "Workload"), ("processes", "Processes"), ("progress", "Progress"),
            ("started", "Started"), ("duration", "Duration"), ("loss", "Loss (sparkline)"),
            ("final_loss", "Final loss"))  # fmt: skip


def _runs_table(
    db: Session, asked: dict[str, str], *, archived: ArchivedView, status: RunStatus | None, offset: int
) -> tuple[runs_table.RunsTable, dict[str, str]]:
    """The table of the view asked, and what is wrong with each box it could not take: that box is left out and the
    view read again, so a typo in one box still shows the runs the others find."""
    boxes, errors = dict(asked), dict[str, str]()
    while True:
        try:
            view = run_query.parse(search=boxes["q"], filter=boxes["filter"], sort=boxes["sort"],
                                   columns=boxes["columns"], archived=archived, status=status)  # fmt: skip
            return runs_table.page(db, query=view, limit=PAGE_SIZE, offset=offset, sparklines=True), errors
        except FieldInvalid as error:
            if not boxes.get(error.field):  # not one of the boxes, or already left out: an error page
                raise
            errors[error.field] = error.message
            boxes[error.field] = ""


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
    settings = request.app.state.settings
    # The cluster's partitions, from sinfo; an empty list where Slurm does not answer (the form still offers it).
    partitions = None if launchers.slurm is None else (launchers.slurm.partitions() or {})
    context = {
        "groups": run_form_groups(capacity=local.capacity, partitions=partitions),
        "values": values,
        "errors": errors,
        "capacity": local.capacity,
        "gpu_count": local.gpu_count,
        "slurm": launchers.slurm is not None,
        "scripts": scripts.offered_scripts(settings.script_roots),  # the script field's picker
        "scripts_dir": settings.scripts_dir,
    }
    return page(request, "new_run.html", context, status_code=status_code)


# The form posts to its own URL (/runs/new, with the query it was opened with), so a field error renders the form
# again at that URL, with or without JavaScript; POST /runs is the same verb, for the demo button and scripts.
@router.post("/runs/new")
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
    run = runs.create_run(
        db, spec=spec, settings=settings, folders=folders, launchers=launchers, actor=caller.name, role=caller.role
    )
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
    parts: StreamParts = "all",
    watch: Watch = None,
) -> StreamingResponse:
    """New points, status and output of a run; from `after`, or on a reconnect from the last point received. The
    points of the `watch` keys only, if given: a page of 200 charts follows the few it has built, and the JSON of
    every key's points, encoded for every page each second, was most of what an open page cost the server."""
    # No request-long session: an SSE connection lasts hours, and an open read transaction would keep SQLite
    # from checkpointing its WAL all that time. Each poll opens and closes its own.
    with request.app.state.sessions() as session:
        runs.get_run(session, run_id=run_id)  # a 404 now, rather than a stream that ends at once

    keys = None if watch is None else frozenset(watch)
    series_keys: dict[int, str] = {}  # the run's, by id: read once for the stream, not each poll

    def snapshot(after_id: int) -> Snapshot:
        # Whether it is over first: a run seen final has stored its last point, so the points read after it are all.
        # A stream of points alone reads only that, not the view its fragments render from.
        fragments = None
        if parts == "points":
            with request.app.state.sessions() as session:
                final = run_is_over(session, run_id=run_id)
        else:
            fragments = request.app.state.run_fragments.get(run_id, lambda: run_fragments(request, run_id))
            final = fragments.final
        if parts == "fragments":
            return Snapshot(LivePoints([], after_id, missed=False), fragments, final)
        with request.app.state.sessions() as session:
            live = metrics.new_points(session, run_id=run_id, after_id=after_id, watch=keys, keys=series_keys)
        return Snapshot(live, fragments, final)

    after_id = after if last_event_id is None else last_event_id
    events = run_events(request, after_id=after_id, snapshot=snapshot)
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-store"})


def run_fragments(request: Request, run_id: int) -> Fragments:
    """The run page's live fragments, as its stream sends them."""
    state = request.app.state
    with state.sessions() as session:
        view = run_page_view(session, run_id=run_id, folders=state.folders, settings=state.settings)
    context = view_context(view)  # rendered with the session closed: the view needs no database
    # The stream's third fragment (its "output" event) is the forensic panel: each rank's output is the logs panel's,
    # which follows its own stream.
    return Fragments(
        render_block(state.templates, "run.html", "status", context),
        render_block(state.templates, "run.html", "files", context),
        render_block(state.templates, "run.html", "forensics", context),
        view.run.status.is_final,
    )


def view_context(view: RunPageView) -> dict[str, Any]:
    """run.html's context: the view, and its run by the short name every part of the page reads it by."""
    launcher = kind(view.run.launcher)
    desync = offers_desync(view, launcher)
    findings = view.findings
    return {
        "view": view,
        "run": view.run,
        "launcher": launcher,  # what its kind of run offers
        "like_refusal": like_refusal(view.run),  # why "New run like this" is not offered; None where it is
        "offers_desync": desync,
        # The forensic panel is drawn only when it has something to say; a healthy run shows its Dump button alone.
        "forensics": bool(desync or view.dump or findings.nonfinite or findings.stragglers or findings.divergence),
        "comm_advice": comm_advice_holds(view),
    }


def offers_desync(view: RunPageView, launcher: type[Launcher]) -> bool:
    """Whether the page offers a re-run with desync checks: the run ended badly or hangs, and had none."""
    run, state = view.run, view.health
    troubled = run.status in (RunStatus.failed, RunStatus.lost, RunStatus.stopped) or state.state != "ok"
    had_them = bool((run.config or {}).get("desync_checks"))
    # The run page's view of the run, as the template asks it: a refusal reads only what the view has too.
    return troubled and not had_them and not launcher.rerun_refusal(run)  # type: ignore[arg-type]


ADVICE_RUN = timedelta(minutes=15)  # a shorter run gains too little from tuning its communication to be told to


def comm_advice_holds(view: RunPageView) -> bool:
    """Whether the page says what would cut the run's communication: it dominates the step now, while the run still
    trains, and the run is long enough (so far and still to go) for a change to matter."""
    progress = view.progress
    length = (progress.elapsed or timedelta()) + (progress.eta or timedelta())
    live = view.run.status in (RunStatus.starting, RunStatus.running)
    return view.efficiency.comm_dominates and live and length >= ADVICE_RUN


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
