"""Posts a `SourceRun` into the server as a finished run launched elsewhere: a join, its points in batches of the
ingest endpoint's largest size (each point with the step and wall time the source kept), its tags and notes, and
its ending. The server stores a point once per (run, key, step, rank), which is what makes an import cut short
safe to run again."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

from .. import external, wire
from ..client import FINAL, Client, ClientError
from ..report import IngestConnection, Outcome, outcome_of
from . import Point, Reading, SourceRun

_TRIES = 6  # a server that restarts answers within a few seconds: 1 + 2 + 4 + 8 + 16 s of waiting
_FIRST_PAUSE_S = 1.0


@dataclass(frozen=True)
class Imported:
    """What became of one source run: its run on the server, the points posted, and how many of them were new."""

    run_id: int
    points: int = 0
    stored: int = 0
    already: bool = False  # imported and ended before: nothing was posted


class Uploader:
    """Imports source runs into the server `client` talks to, with the client's API token."""

    def __init__(self, client: Client, host: str | None = None) -> None:
        self.client = client
        self.host = (host or socket.gethostname())[: wire.MAX_HOST_LENGTH]
        self._ended: dict[str, int] | None = None

    def ended_runs(self) -> dict[str, int]:
        """The key and id of every run launched elsewhere that has ended, read once: joining one of them again would
        reopen it (as a requeued job), so an import skips them instead."""
        if self._ended is None:
            self._ended, offset = {}, 0
            while True:
                page = self.client.table(limit=500, offset=offset, q="external", archived="all")
                for run in page["items"]:
                    if run.get("external_key") and run["status"] in FINAL:
                        self._ended[run["external_key"]] = run["id"]
                offset += len(page["items"])
                if not page["items"] or offset >= page["total"]:
                    return self._ended
        return self._ended

    def upload(self, run: SourceRun, reading: Reading, on_batch: Callable[[], None] = lambda: None) -> Imported:
        """Import one run (a no-op for one imported and ended before); `on_batch` is called after each post."""
        if run.key in self.ended_runs():
            return Imported(self.ended_runs()[run.key], already=True)
        joined = self._join(run)
        run_id = int(joined.run_id)
        if run.tags or run.notes:
            self.client.label(run_id, **({"tags": list(run.tags)} if run.tags else {}),
                              **({"notes": run.notes} if run.notes else {}))  # fmt: skip
        connection = IngestConnection(self.client.url, joined.run_id, joined.token)
        posted = stored = last_step = 0
        try:
            for chunk in _chunks(_sendable(run.read(reading), reading), wire.MAX_POINTS_PER_BATCH):
                stored += self._post(connection, _columns_body(chunk))
                posted += len(chunk)
                last_step = max(last_step, max(point[1] for point in chunk))
                on_batch()
            end = wire.Batch(heartbeat=wire.Heartbeat(0, self.host, last_step),
                             ended=wire.Ended(0, self.host, run.ending, run.error))  # fmt: skip
            self._post(connection, json.dumps(end.to_json()).encode())
        finally:
            connection.close()
        self.ended_runs()[run.key] = run_id
        return Imported(run_id, posted, stored)

    def _join(self, run: SourceRun) -> external.Joined:
        request = wire.Join(key=run.key, name=run.name[:100] or "imported", config=run.config, rank=0, world_size=1,
                            local_world_size=1, host=self.host)  # fmt: skip
        token = self.client.token or ""
        for pause in _pauses():
            status, joined, detail = external.join(self.client.url, token, request)
            if joined is not None:
                return joined
            if not outcome_of(status).keeps or pause is None:
                raise ClientError(f"the server refused to make run {run.name!r}: {detail}", status)
            time.sleep(pause)
        raise AssertionError("unreachable")

    def _post(self, connection: IngestConnection, body: bytes) -> int:
        """Post one batch, again while the server is away or failing; returns the points it stored anew."""
        for pause in _pauses():
            status, detail, reply = connection.post(body)
            outcome = outcome_of(status)
            if outcome is Outcome.ACCEPTED:
                return int(json.loads(reply).get("stored", 0))
            if not outcome.keeps or pause is None:
                raise ClientError(f"the server did not take a batch: {detail}", status)
            time.sleep(pause)
        raise AssertionError("unreachable")


def _pauses() -> Iterator[float | None]:
    """The waits between tries; None at the last try."""
    for attempt in range(_TRIES - 1):
        yield _FIRST_PAUSE_S * 2**attempt
    yield None


def _sendable(points: Iterable[Point], reading: Reading) -> Iterator[Point]:
    """The points the server takes; one with a key or step it would refuse the whole batch for is counted skipped."""
    for point in points:
        key, step = point[0], point[1]
        if not 0 < len(key) <= wire.MAX_KEY_LENGTH:
            reading.skipped[f"points whose key is empty or longer than {wire.MAX_KEY_LENGTH} characters"] += 1
        elif not 0 <= step <= wire.MAX_STEP:
            reading.skipped["points at a negative step"] += 1
        else:
            yield point


def _chunks(points: Iterable[Point], size: int) -> Iterator[list[Point]]:
    iterator = iter(points)
    while chunk := list(islice(iterator, size)):
        yield chunk


def _columns_body(points: list[Point]) -> bytes:
    """One batch in the compact format: a column per key (all rank 0), NaN and infinities written bare."""
    columns: dict[str, tuple[list[int], list[float], list[float]]] = {}
    for key, step, value, unix_time in points:
        column = columns.get(key)
        if column is None:
            column = columns[key] = ([], [], [])
        column[0].append(step)
        column[1].append(value)
        column[2].append(unix_time)
    batch = wire.Batch(columns=tuple(wire.Column(key, 0, *arrays) for key, arrays in columns.items()))
    return json.dumps(batch.to_json(), separators=(",", ":")).encode()
