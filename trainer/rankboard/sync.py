"""`rankboard sync DIR...`: runs kept in folders (rankboard.offline) uploaded into a server, each as the one run its
key names, as if its processes had reached the server while they ran.

Every rank's process joins the run with the join request it kept (its config, total steps, checkpoint folder, its
rank among the job's), its batches are posted in the order they were written, and only then does each rank say how
it ended, so that the run ends with every point in. The server stores a point once per (run, key, step, rank), so a
second sync stores nothing twice and a sync cut short is finished by the next; each rank's `.synced.json` lets the
next one start where the last stopped rather than post everything again. A run the server has already seen end (a
sync done before) is left as it is: joining it again would reopen it as a requeued job. One the server called lost
is not ended: a sync brings it back.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from . import external, wire
from .client import FINAL, Client, ClientError
from .offline import JOIN_GLOB, RankFiles, write_json
from .report import IngestConnection, Outcome, outcome_of

_PAUSES_S = (1.0, 2.0, 4.0, 8.0)  # between tries while the server is away or failing: a restart fits in them
_POST_TIMEOUT_S = 60.0  # a batch of 10,000 points on a busy server: never cut short and sent again for being slow


@dataclasses.dataclass
class Synced:
    """What a sync did with one run kept in a folder."""

    key: str
    name: str
    ranks: int
    run_id: int | None = None
    status: str = ""  # the run's on the server once synced
    batches: int = 0  # posted by this sync
    resumed: int = 0  # posted by a sync before (its .synced.json says so), not posted again
    points: int = 0  # in the batches the server took
    stored: int = 0  # of them, new to the server
    refused: int = 0  # batches the server can never take (a 4xx), as the reporter would have dropped them
    refused_why: str = ""  # the server's answer to the first
    unended: list[int] = dataclasses.field(default_factory=list)  # ranks of the job whose ending is not in the folders
    already: bool = False  # the run had ended on the server before: nothing was sent

    def sentence(self) -> str:
        """One line for the terminal."""
        head = f"run {self.run_id} {self.name!r} ({self.key})"
        if self.already:
            return f"{head}: already synced, {self.status}; nothing sent"
        before = f" (and {self.resumed:,} by a sync before)" if self.resumed else ""
        refused = f", {self.refused:,} batches refused ({self.refused_why})" if self.refused else ""
        ranks = f"{self.ranks} rank{'s' * (self.ranks != 1)}"
        line = (f"{head}: {ranks}, {self.batches:,} batches sent{before}, {self.points:,} points "
                f"({self.stored:,} new){refused}; {self.status}")  # fmt: skip
        if self.unended:
            line += (f"; rank {', '.join(map(str, self.unended))} left no ending here (killed, still running, or in "
                     "another node's folder): the server calls the run lost once it stays silent")  # fmt: skip
        return line


Kept = list[tuple[RankFiles, wire.Join]]  # the ranks' processes of one run, each with its join request


def kept_runs(folders: Iterable[Path]) -> dict[str, Kept]:
    """The runs kept in these folders (each a run's folder, or one holding runs' folders), by key; a run's ranks
    may be spread over several folders (one a node). Raises ClientError for a folder that holds none."""
    found: dict[str, Kept] = {}
    seen: set[Path] = set()
    for folder in folders:
        joins = sorted(folder.glob(JOIN_GLOB)) or sorted(folder.glob(f"*/{JOIN_GLOB}"))
        if not joins:
            raise ClientError(f"{folder}: no run kept there (no {JOIN_GLOB} in it, nor in its folders)")
        for path in joins:
            if path.resolve() in seen:  # a folder named twice, or inside another named
                continue
            seen.add(path.resolve())
            files = RankFiles.from_join(path)
            try:
                join = files.read_join()
            except (OSError, ValueError) as error:
                raise ClientError(f"cannot read {path}: {error}") from None
            found.setdefault(join.key, []).append((files, join))
    return found


class Syncer:
    """Uploads kept runs into the server `client` talks to, with the client's API token."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._runs: dict[str, dict[str, Any]] | None = None

    def runs_by_key(self) -> dict[str, dict[str, Any]]:
        """The server's runs launched elsewhere, by key; read once."""
        if self._runs is None:
            self._runs, offset = {}, 0
            while True:
                page = self.client.table(limit=500, offset=offset, q="external", archived="all")
                self._runs |= {run["external_key"]: run for run in page["items"] if run.get("external_key")}
                offset += len(page["items"])
                if not page["items"] or offset >= page["total"]:
                    break
        return self._runs

    def sync(self, key: str, kept: Kept) -> Synced:
        """Upload one run: every rank's batches, then every rank's ending."""
        kept = sorted(kept, key=lambda pair: (pair[1].rank, pair[0].stem))
        synced = Synced(key, kept[0][1].name, ranks=len({join.rank for _, join in kept}))
        known = self.runs_by_key().get(key)
        if known is not None and known["status"] in FINAL and known["status"] != "lost":
            synced.run_id, synced.status, synced.already = known["id"], known["status"], True
            return synced
        tokens, fresh = [], False
        for files, join in kept:
            joined = self._join(join)
            synced.run_id, fresh = int(joined.run_id), fresh or joined.created
            self._send_batches(files, joined, synced, resume=not fresh)
            tokens.append((files, join, joined))
        self._send_endings(tokens, synced)
        assert synced.run_id is not None  # every kept run has a rank
        synced.status = self.client.get(synced.run_id)["status"]
        return synced

    def _join(self, join: wire.Join) -> external.Joined:
        for pause in _tries():
            status, joined, detail = external.join(self.client.url, self.client.token or "", join)
            if joined is not None:
                return joined
            if not outcome_of(status).keeps or pause is None:
                raise ClientError(f"the server refused rank {join.rank}'s join of run {join.key!r}: {detail}", status)
            time.sleep(pause)
        raise AssertionError("unreachable")

    def _send_batches(self, files: RankFiles, joined: external.Joined, synced: Synced, *, resume: bool) -> None:
        """Post a rank's batches not yet taken, in order: the spool, then those set aside; `resume`: after those a
        sync before had posted to this run (never to a run this sync made)."""
        marker = _marker(files, int(joined.run_id), resume=resume)
        connection = IngestConnection(self.client.url, joined.run_id, joined.token, timeout=_POST_TIMEOUT_S)
        try:
            for path in (files.batches, files.aside):
                for number, body in _lines(path, after=marker["lines"].get(path.name, 0), synced=synced):
                    self._take(connection, body, synced)
                    marker["lines"][path.name] = number
                    write_json(files.synced, marker)
        finally:
            connection.close()

    def _take(self, connection: IngestConnection, body: bytes, synced: Synced) -> None:
        """Post one batch and count what became of it."""
        outcome, detail, reply = _post(connection, body)
        synced.batches += 1
        if outcome is Outcome.RUN_OVER:
            raise ClientError(f"run {synced.run_id} ended on the server during the sync: {detail}", 409)
        if outcome is Outcome.ACCEPTED:
            answer = json.loads(reply)
            synced.points += int(answer.get("accepted", 0))
            synced.stored += int(answer.get("stored", 0))
        else:
            synced.refused += 1
            synced.refused_why = synced.refused_why or detail

    def _send_endings(self, ranks: list[tuple[RankFiles, wire.Join, external.Joined]], synced: Synced) -> None:
        """Each rank's ending, its newest process's where there were several; last, so that the run ends (a rank
        that failed ends it at once) only with every rank's points in."""
        newest: dict[int, tuple[float, wire.Ended, external.Joined]] = {}
        for files, join, joined in ranks:
            try:
                ended = files.read_ended()
            except ValueError as error:
                raise ClientError(str(error)) from None
            when = files.ended.stat().st_mtime if ended is not None else 0.0
            if ended is not None and (join.rank not in newest or when >= newest[join.rank][0]):
                newest[join.rank] = (when, ended, joined)
        synced.unended = sorted(set(range(ranks[0][1].world_size)) - set(newest))
        for _, ended, joined in sorted(newest.values(), key=lambda item: item[1].rank):
            connection = IngestConnection(self.client.url, joined.run_id, joined.token, timeout=_POST_TIMEOUT_S)
            try:
                _post(connection, json.dumps(wire.Batch(ended=ended).to_json()).encode())  # 409: the run has ended
            finally:
                connection.close()


def _marker(files: RankFiles, run_id: int, *, resume: bool) -> dict[str, Any]:
    """How far a sync before got into this rank's files, posting to run `run_id`; from the start unless `resume`."""
    try:
        marker = json.loads(files.synced.read_text())
        if resume and marker.get("run_id") == run_id and isinstance(marker.get("lines"), dict):
            return dict(marker)
    except (OSError, ValueError):
        pass  # none, or unreadable: from the start, which stores nothing twice
    return {"run_id": run_id, "lines": {}}


def _lines(path: Path, *, after: int, synced: Synced) -> Iterator[tuple[int, bytes]]:
    """A batches file's lines after the first `after`, each with its number; a last line without its newline is
    still being written (or was torn by a crash), and is left for the next sync."""
    try:
        file = path.open("rb")
    except FileNotFoundError:
        return
    with file:
        for number, line in enumerate(file, 1):
            if number <= after:
                synced.resumed += 1
            elif line.endswith(b"\n") and line.strip():
                yield number, line.rstrip(b"\n")


def _post(connection: IngestConnection, body: bytes) -> tuple[Outcome, str, bytes]:
    """Post a batch, again while the server is away or failing; raises ClientError once it stays so."""
    for pause in _tries():
        status, detail, reply = connection.post(body)
        outcome = outcome_of(status)
        if not outcome.keeps:
            return outcome, detail, reply
        if pause is None:
            raise ClientError(f"the server did not take a batch ({detail}); run `rankboard sync` again: it goes on "
                              "where this one stopped", status)  # fmt: skip
        time.sleep(pause)
    raise AssertionError("unreachable")


def _tries() -> Iterator[float | None]:
    """The pause after each try; None after the last."""
    yield from _PAUSES_S
    yield None
