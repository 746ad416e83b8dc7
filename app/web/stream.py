"""Server-sent events for a run page: new metric points, and the status and output fragments when they change.

Every message is read from the database and the run's files on each poll, never from in-process state, so any
number of pages (and a restarted server) see the same thing. A reconnecting browser sends Last-Event-ID, the id of
the last point it got, and continues from there without duplicates. The pages of one run share the rendering of its
fragments (`SharedFragments`): one rendering per poll interval, however many pages watch the run.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from rankboard import wire

from app.services.metrics import LivePoints
from app.store.metrics import StoredPoint

POLL_SECONDS = 1.0
# A rendering that takes longer than a tenth of POLL_SECONDS is shared for ten times what it took, so that the pages
# of a big run (its stragglers read over every rank) take at most a tenth of a core, however many ranks it has.
RENDER_SHARE = 0.1


@dataclass(frozen=True)
class Fragments:
    """A run page's fragments as rendered at one moment, and whether the run was over then."""

    status_html: str
    files_html: str  # checkpoints and history
    output_html: str
    final: bool


@dataclass(frozen=True)
class Snapshot:
    """One poll: the points after the page's cursor, and the fragments (None for a stream of points alone, which
    reads only whether the run is over)."""

    live: LivePoints
    fragments: Fragments | None
    final: bool


@dataclass
class _Rendering:
    """The last rendering of one run's fragments; `lock` is held while it is being made."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    at: float = -math.inf  # time.monotonic()
    took: float = 0.0  # seconds
    fragments: Fragments | None = None


class SharedFragments:
    """The fragments of each run, rendered at most once per `max_age_s` however many pages watch the run.

    Every page of a run polls once a second, and each would render the same fragments from the same rows and files:
    the first poll renders them, and the polls of the same run within `max_age_s` after it get that rendering. So a
    page sees what it would have seen polling a moment earlier; nothing else is kept, no fragment is ever older than
    `max_age_s` (or than what its rendering took over RENDER_SHARE, where that is longer), and a restarted server
    starts empty. A rendering of a finished run is never shared: a run can be resumed the next moment, and a page
    opened then must not end its stream on what the run was before.
    """

    def __init__(self, max_age_s: float = POLL_SECONDS) -> None:
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._runs: dict[int, _Rendering] = {}

    def get(self, run_id: int, render: Callable[[], Fragments]) -> Fragments:
        """The run's fragments rendered less than `max_age_s` ago, or `render()` now (once, for all who ask)."""
        with self._lock:
            self._forget_unwatched()
            last = self._runs.setdefault(run_id, _Rendering())
        with last.lock:  # a page asking meanwhile waits for this rendering rather than making its own
            fresh = time.monotonic() - last.at < max(self.max_age_s, last.took / RENDER_SHARE)
            if last.fragments is None or not fresh or last.fragments.final:
                began = time.monotonic()
                last.fragments, last.at = render(), time.monotonic()
                last.took = last.at - began
            return last.fragments

    def _forget_unwatched(self) -> None:
        unwatched = time.monotonic() - 60 * self.max_age_s
        for run_id in [run for run, last in self._runs.items() if last.at < unwatched and not last.lock.locked()]:
            del self._runs[run_id]


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


def points_json(points: list[StoredPoint], *, missed: bool = False, others: frozenset[str] = frozenset()) -> str:
    """Points grouped by key as parallel arrays (with each point's unix time, for a wall-time axis), values encoded
    as the wire does (NaN survives); `missed` tells the page that points after its cursor were dropped from the live
    log, so it reads its charts again; `others` names the keys not watched that got points."""
    series: dict[str, dict[str, list[float | str | int]]] = {}
    for p in points:
        one = series.setdefault(p.key, {"steps": [], "values": [], "ranks": [], "times": []})
        one["steps"].append(p.step)
        one["times"].append(p.time)
        one["values"].append(wire.encode_value(p.value))
        one["ranks"].append(p.rank)
    return json.dumps({"series": series, "others": sorted(others), "missed": missed})


def _changed(fragments: Fragments, state: StreamState) -> list[str]:
    """The messages of the fragments that changed since the page last got them; `state` takes them."""
    news = []
    for event, name in (("status", "status_html"), ("files", "files_html"), ("output", "output_html")):
        html = getattr(fragments, name)
        if html != getattr(state, name):
            setattr(state, name, html)
            news.append(message(event, html))
    return news


async def run_events(request: Request, *, after_id: int, snapshot: Callable[[int], Snapshot]) -> AsyncIterator[str]:
    """The stream of one run page (its points alone where the snapshots have no fragments); ends with an `end` event
    once the run is over and everything was sent."""
    state = StreamState(after_id=after_id)
    while not await request.is_disconnected():
        snap = await run_in_threadpool(snapshot, state.after_id)
        live, points = snap.live, snap.live.points
        state.after_id = live.cursor
        if points or live.missed or live.others:
            yield message("points", points_json(points, missed=live.missed, others=live.others), state.after_id)
        if snap.fragments is not None:
            for news in _changed(snap.fragments, state):
                yield news
        if snap.final and not points:
            yield message("end", "")
            return
        if not points:  # a backlog is sent at once, page by page; otherwise wait for news
            await asyncio.sleep(POLL_SECONDS)
