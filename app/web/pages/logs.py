"""The run page's log panel: the panel fragment, and the live tail of one log over server-sent events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, StreamingResponse

from app.core.folders import RunFolders
from app.core.models import Run, RunStatus
from app.launcher.launchers import kind
from app.services import logs, runs
from app.web.api import logs as logs_api
from app.web.deps import FoldersDep, SessionDep
from app.web.params import LogFilter, LogRankQuery, LogStreamQuery, RunId
from app.web.stream import message
from app.web.templating import render_block

pages = APIRouter(include_in_schema=False)
router = APIRouter()  # what app.main registers: these pages and the logs API
POLL_SECONDS = 0.5
TAIL_LINES = 200


@pages.get("/runs/{run_id}/logs", response_class=HTMLResponse)
def logs_panel(request: Request, run_id: RunId, db: SessionDep, folders: FoldersDep) -> HTMLResponse:
    """The panel: rank and stream choices, the filter, and what went wrong; its script starts the live tail."""
    run = runs.get_run(db, run_id=run_id)
    context = panel_context(run, folders=folders, world_size=kind(run.launcher).ranks(run))
    return HTMLResponse(render_block(request.app.state.templates, "_logs.html", "panel", context))


def panel_context(run: Run, *, folders: RunFolders, world_size: int) -> dict[str, Any]:
    files = logs.log_files(run, folders=folders)
    found = logs.diagnoses(run, folders=folders)
    # Every rank the run will have, before its files exist: the panel is drawn once, often while the run waits.
    ranks = sorted({f.rank for f in files if f.rank is not None} | set(range(world_size)))
    rank, stream = logs.opening_log(run, folders=folders, found=found)  # where the rank that failed first wrote
    launcher = logs.launcher_output(run, folders=folders)
    return {
        "run": run, "panel": True, "ranks": ranks, "sizes": {(f.rank_name, f.stream): f.size for f in files},
        "guessed": {f.rank for f in files if f.rank_guessed}, "diagnoses": found,
        "launcher_name": launcher.name if launcher else "", "launcher_label": kind(run.launcher).output_label(run),
        "explain": bool(found) or run.status in (RunStatus.failed, RunStatus.lost),
        "rank": rank, "stream": stream,
    }  # fmt: skip


@pages.get("/runs/{run_id}/logs/stream")
def log_stream(
    request: Request,
    run_id: RunId,
    rank: LogRankQuery = "0",
    stream: LogStreamQuery = "stdout",
    filter: LogFilter = "",
) -> StreamingResponse:
    """The tail of one log, then its new lines as they are written; ends once the run is over and all was sent."""
    # No request-long session: each poll opens its own (see app.web.pages.runs.run_stream for why).
    with request.app.state.sessions() as session:
        runs.get_run(session, run_id=run_id)  # a 404 now rather than a stream that ends at once
    follower = logs.LogFollower(logs.parse_rank(rank), logs.check_stream(stream), filter, TAIL_LINES)
    events = _log_events(request, run_id, follower)
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-store"})


async def _log_events(request: Request, run_id: int, follower: logs.LogFollower) -> AsyncIterator[str]:
    """Events: `reset` (lines that replace those shown), `lines` (to append), `explain` (the what-went-wrong box,
    once the run is over), `end`."""
    folders = request.app.state.folders

    def poll() -> tuple[logs.LogUpdate, str | None]:
        with request.app.state.sessions() as session:
            run = runs.get_run(session, run_id=run_id)
            update = logs.follow(follower, run, folders=folders)
            if not update.done:
                return update, None
            context = panel_context(run, folders=folders, world_size=kind(run.launcher).ranks(run))
            return update, render_block(request.app.state.templates, "_logs.html", "explain", context)

    while not await request.is_disconnected():
        update, explain = await run_in_threadpool(poll)
        if update.reset:
            yield message("reset", json.dumps({"lines": update.lines, "budget_hit": update.budget_hit}))
        elif update.lines:
            yield message("lines", json.dumps(update.lines))
        if explain is not None:
            yield message("explain", explain)
            yield message("end", "")
            return
        if not update.lines and not update.reset:
            await asyncio.sleep(POLL_SECONDS)


router.include_router(logs_api.router)
router.include_router(pages)
