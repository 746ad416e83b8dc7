"""Server-sent events for a run page: new metric points, and the status and output fragments when they change.

Every message is read from the database and the run's files on each poll, never from in-process state, so any
number of pages (and a restarted server) see the same thing. A reconnecting browser sends Last-Event-ID, the id of
the last point it got, and continues from there without duplicates.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from app.store.metrics import StoredPoint
from trainer import wire

POLL_SECONDS = 1.0


@dataclass
class Snapshot:
    """What changed since the last poll."""

    points: list[StoredPoint]
    status_html: str
    files_html: str  # checkpoints and history
    output_html: str
    final: bool


@dataclass
class StreamState:
    after_id: int
    status_html: str = ""
    files_html: str = ""
    output_html: str = ""


def message(event: str, data: str, event_id: int | None = None) -> str:
    """One SSE message; every line of the data gets its own `data:` prefix, as the format requires."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    body = "".join(f"data: {line}\n" for line in data.splitlines() or [""])
    return f"{head}event: {event}\n{body}\n"


def points_json(points: list[StoredPoint]) -> str:
    """Points grouped by key as parallel arrays, values encoded as the wire does (NaN survives)."""
    series: dict[str, dict[str, list[float | str | int]]] = {}
    for p in points:
        one = series.setdefault(p.key, {"steps": [], "values": [], "ranks": []})
        one["steps"].append(p.step)
        one["values"].append(wire.encode_value(p.value))
        one["ranks"].append(p.rank)
    return json.dumps({"series": series})


async def run_events(
    request: Request, *, run_id: int, after_id: int, snapshot: Callable[[int], Snapshot]
) -> AsyncIterator[str]:
    """The stream of one run page; ends with an `end` event once the run is over and everything was sent."""
    state = StreamState(after_id=after_id)
    while not await request.is_disconnected():
        snap = await run_in_threadpool(snapshot, state.after_id)
        if snap.points:
            state.after_id = snap.points[-1].id
            yield message("points", points_json(snap.points), state.after_id)
        if snap.status_html != state.status_html:
            state.status_html = snap.status_html
            yield message("status", snap.status_html)
        if snap.files_html != state.files_html:
            state.files_html = snap.files_html
            yield message("files", snap.files_html)
        if snap.output_html != state.output_html:
            state.output_html = snap.output_html
            yield message("output", snap.output_html)
        if snap.final and not snap.points:
            yield message("end", "")
            return
        if not snap.points:  # a backlog is sent at once, page by page; otherwise wait for news
            await asyncio.sleep(POLL_SECONDS)
