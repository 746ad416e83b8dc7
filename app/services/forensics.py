"""Which rank, and why: dump every rank's stacks on request, and name the rank the others wait for.

A request is a number on the run (`dump_request`); while it is fresh, the reply to every ingest POST names it, and
each rank's reporter thread (rankboard/report.py), which runs while the main thread blocks in a collective, answers it
once with its stacks and flight recorder (trainer/rankboard/forensics.py). The answers are kept in the run folder,
`dumps/<request>/rank-<rank>.json`, and read back for the run page and the API. No open port on the ranks, no
ptrace: the request rides on the connection each rank already has, from any node.

The ranks answer seconds apart, so each also says whether it moved on in the seconds after its stack, and a newer
heartbeat step since tells the same on read: a culprit is named only when no rank moved and all were seen at one
moment; else the ranks are progressing, and the stacks are shown all the same.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.core.errors import FieldInvalid, InvalidToken, RunNotActive
from app.core.folders import RunFolders
from app.core.models import Run, RunStatus
from app.core.settings import Settings
from app.launcher.launchers import Launchers, kind
from app.schemas.forensics import DumpOut, DumpsOut, RankDumpIn, RankStateOut
from app.schemas.runs import RunCreate
from app.services import dump_requests, metrics, runs
from app.store import audit
from app.store import ranks as rank_store

DUMPS = "dumps"
LIVE = (RunStatus.starting, RunStatus.running, RunStatus.stopping)
LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")
TOP_FRAMES = 4
DESYNC_TIMEOUT_S = 30  # a re-run with desync checks fails this soon at a hang, naming the rank
Progress = Literal["moved", "still", "unknown"]


def request_dump(db: Session, *, run_id: int, actor: str) -> int:
    """Ask every rank of a live run for its stacks; returns the request's number."""
    with db.begin():
        run = runs.get_run(db, run_id=run_id)
        if run.status not in LIVE:
            raise RunNotActive(f"run {run_id} is {run.status.value}: only a live run's ranks can be dumped")
        request = dump_requests.ask(run)
        audit.record(db, actor=actor, action="dump requested", run_id=run.id, detail=f"request {request}")
    return request


def rerun_with_desync_checks(
    db: Session, *, run_id: int, settings: Settings, folders: RunFolders, launchers: Launchers, actor: str
) -> Run:
    """A new run with the options of this one, TORCH_DISTRIBUTED_DEBUG=DETAIL and a short process-group timeout: its
    failure explanation names the rank that does not reach a collective."""
    with db.begin():  # create_run opens its own transaction: this read's ends first
        run = runs.get_run(db, run_id=run_id)
        if refusal := kind(run.launcher).rerun_refusal(run):
            raise RunNotActive(refusal)
        options = RunCreate.values_of(run)  # what it never had (a script's run: trainer options) keeps its default
        name = f"{run.name} (desync checks)"[-100:]
        timeout = min(run.pg_timeout_s or DESYNC_TIMEOUT_S, DESYNC_TIMEOUT_S)
    spec = RunCreate.model_validate({**options, "name": name, "desync_checks": True, "pg_timeout_s": timeout})
    return runs.create_run(db, spec=spec, settings=settings, folders=folders, launchers=launchers, actor=actor)


def receive_dump(db: Session, *, run_id: int, token: str, request: int, dump: RankDumpIn, folders: RunFolders) -> None:
    """Keep one rank's answer, checked against the run's token and its open request."""
    with db.begin():
        run = runs.get_run(db, run_id=run_id)
        if not metrics.token_fits(db, run, token):
            raise InvalidToken(f"the token is not the one run {run_id} was launched with")
        if dump.request != request:
            raise FieldInvalid("request", f"the dump answers request {dump.request}, posted to request {request}")
        if run.dump_request is None or not 1 <= request <= run.dump_request:
            raise FieldInvalid("request", f"run {run_id} has no dump request {request}")
        folder = folders.run_dir(run) / DUMPS / str(request)
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / f"rank-{dump.rank}.json", dump.model_dump_json().encode())


def _write(path: Path, body: bytes) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as file:
        file.write(body)
    os.replace(file.name, path)  # whole or not at all: a page may read it at any moment


def run_dump(db: Session, *, run_id: int, folders: RunFolders) -> DumpsOut:
    """The run's newest dump, analysed (None before any request); raises RunNotFound."""
    run = runs.get_run(db, run_id=run_id)
    return DumpsOut(latest=latest_dump(db, run=run, folders=folders, world_size=kind(run.launcher).ranks(run)))


def latest_dump(db: Session, *, run: Run, folders: RunFolders, world_size: int) -> DumpOut | None:
    """The newest request's answers, analysed; None before any request."""
    if run.dump_request is None:
        return None
    folder = folders.run_dir(run) / DUMPS / str(run.dump_request)
    dumps = sorted(_read(folder), key=lambda dump: dump.rank)
    later = _later_steps(db, run)
    return analyse(run.dump_request, run.dump_requested_at, dumps, expected=world_size, later_steps=later)


def _later_steps(db: Session, run: Run) -> dict[int, int]:
    """Each rank's step in its heartbeats received since the request."""
    since = run.dump_requested_at
    if since is None:
        return {}
    return {row.rank: row.step for row in rank_store.rank_rows(db, run_id=run.id) if row.heartbeat_at >= since}


def _read(folder: Path) -> list[RankDumpIn]:
    dumps = []
    for path in folder.glob("rank-*.json") if folder.is_dir() else ():
        try:
            dumps.append(RankDumpIn.model_validate_json(path.read_bytes()))
        except (OSError, ValidationError):
            continue  # removed meanwhile, or not ours: the others still tell
    return dumps


def analyse(
    request: int,
    requested_at: datetime | None,
    dumps: Sequence[RankDumpIn],
    *,
    expected: int,
    later_steps: Mapping[int, int] | None = None,
) -> DumpOut:
    """Each rank's state, and the sentence naming the rank the others wait for; `later_steps`: each rank's step in
    heartbeats received since the request, which shows a rank that moved on after its dump."""
    states = [rank_state(dump, later_step=(later_steps or {}).get(dump.rank)) for dump in dumps]
    answered = {state.rank for state in states}
    missing = [rank for rank in range(expected) if rank not in answered]
    culprits, verdict = _verdict(states, missing)
    return DumpOut(request=request, requested_at=requested_at, expected=expected, ranks=states, missing=missing,
                   culprits=culprits, verdict=verdict)  # fmt: skip


def rank_state(dump: RankDumpIn, *, later_step: int | None = None) -> RankStateOut:
    """What one rank's dump says: the collective it is in, its last sequence number, where its own code stands,
    whether it moved on."""
    inside = next((f.function for f in dump.stack if f.file.endswith("distributed_c10d.py")), None)
    last = dump.collectives[-1] if dump.collectives else None
    own = next((f for f in dump.stack if not any(mark in f.file for mark in LIBRARY_MARKS)), None)
    return RankStateOut(
        rank=dump.rank, host=dump.host, pid=dump.pid, taken_at=dump.taken_at, collective=inside,
        last_seq=last.seq if last else None, last_collective=_plain(last.name) if last else None,
        where=_line(own or dump.stack[0]) if dump.stack else "no Python frame",
        top=[_line(frame) for frame in dump.stack[:TOP_FRAMES]], threads=dump.threads,
        recorder_error=dump.recorder_error, step=dump.step, progress=_progress(dump, later_step),
        watched_s=dump.watched_s,
    )  # fmt: skip


def _progress(dump: RankDumpIn, later_step: int | None) -> Progress:
    if dump.moved or (later_step is not None and dump.step is not None and later_step > dump.step):
        return "moved"
    return "still" if dump.moved is False else "unknown"  # unknown: nothing to watch, or a client that does not


def _plain(name: str) -> str:
    return name.rpartition(":")[2]  # "gloo:all_reduce" -> "all_reduce"


def _line(frame: object) -> str:
    file, line, function = (getattr(frame, name) for name in ("file", "line", "function"))
    return f"{Path(file).name}:{line} in {function}"


def _verdict(states: list[RankStateOut], missing: list[int]) -> tuple[list[int], str]:
    """The culprits and the sentence. The ranks answer up to a few seconds apart, in which a healthy rank runs far
    ahead: a culprit is named only when no rank moved on and every rank was seen at one moment."""
    if not states:
        return [], "No rank has answered yet; each answers within a few seconds while its process lives."
    moved = [state for state in states if state.progress == "moved"]
    if moved:
        return [], _progressing(states, moved, missing)
    apart = _apart(states)
    if apart:
        return [], apart
    return _culprits(states, missing)


def _progressing(states: list[RankStateOut], moved: list[RankStateOut], missing: list[int]) -> str:
    """The sentence when a rank moved on after its stack: no rank holds the others up, as none moves on alone."""
    rest = [state for state in states if state.progress != "moved"]
    if not rest:
        return f"All ranks are progressing: each moved on after its stack was taken{_missing(missing)}."
    return (
        f"All ranks are progressing: {_ranks(moved)} moved on after {_verb(moved, 'its', 'their')} stack was taken, "
        f"which collectives allow only with every rank; {_ranks(rest)} {_verb(rest, 'was', 'were')} not seen moving "
        f"(slower than the others, or stopping: dump again if the run stops progressing){_missing(missing)}."
    )


def _apart(states: list[RankStateOut]) -> str | None:
    """Why the ranks were not seen at one moment, or None when they were: every rank's watch without a move (a
    mere moment for a rank that did not watch) overlaps every other's."""
    late = max(states, key=lambda state: state.taken_at)
    early = min(states, key=_watch_end)
    gap = late.taken_at - _watch_end(early)
    if gap <= 0:
        return None
    after = f"rank {early.rank} ended its watch" if early.watched_s else f"rank {early.rank}"
    return (
        f"No rank can be named: the ranks were not seen at one moment (rank {late.rank} {gap:.1f} s after {after}), "
        "and a healthy rank runs far ahead in that time; each stack below is of its own moment."
    )


def _watch_end(state: RankStateOut) -> float:
    return state.taken_at + (state.watched_s or 0.0)


def _culprits(states: list[RankStateOut], missing: list[int]) -> tuple[list[int], str]:
    """From ranks that stood still at one moment: the lowest last sequence number, else the rank outside every
    collective, else a rank that never answered."""
    seqs = {state.last_seq for state in states if state.last_seq is not None}
    waiting = [state for state in states if state.collective]
    if len(seqs) > 1:
        low = min(seqs)
        behind = [s for s in states if s.last_seq == low]
        ahead = [s for s in states if s.last_seq is not None and s.last_seq > low]
        top = max(ahead, key=lambda s: s.last_seq or 0)
        what = f"{top.collective or top.last_collective} #{top.last_seq}"
        return [s.rank for s in behind], (
            f"{_ranks(behind)} never reached {what} that {_ranks(ahead)} {_verb(ahead, 'wait')} in; "
            f"{_its(behind)}{_missing(missing)}"
        )
    outside = [state for state in states if not state.collective]
    if waiting and outside:
        name = waiting[0].collective
        return [s.rank for s in outside], (
            f"{_ranks(outside)} {_verb(outside, 'is', 'are')} in no collective while {_ranks(waiting)} "
            f"{_verb(waiting, 'wait')} in {name}; {_its(outside)}{_missing(missing)}"
        )
    if waiting and missing:
        return missing, (
            f"{_ranks(waiting)} {_verb(waiting, 'wait')} in {waiting[0].collective}; rank"
            f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not answer: its process may be "
            "gone, or its Python stuck holding the GIL."
        )
    if waiting:
        names = sorted({s.collective or "" for s in waiting})
        if len(names) > 1:
            each = "; ".join(f"rank {s.rank} in {s.collective}" for s in waiting)
            return [], f"The ranks wait in different collectives ({each}): they call collectives in a different order."
        return [], f"Every rank is inside {names[0]} and none is behind: look at the transport (network, NCCL)."
    return [], "No rank is inside a collective: " + "; ".join(f"rank {s.rank} at {s.where}" for s in states) + "."


def _ranks(states: Sequence[RankStateOut]) -> str:
    ranks = [str(state.rank) for state in states]
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(ranks)}"


def _verb(states: Sequence[RankStateOut], singular: str, plural: str | None = None) -> str:
    if len(states) == 1:
        return singular + ("" if plural else "s")
    return plural or singular


def _its(states: Sequence[RankStateOut]) -> str:
    return "; ".join(f"rank {s.rank}'s stack: {s.where}" for s in states) + "."


def _missing(missing: list[int]) -> str:
    return f" (no answer yet from rank {', '.join(map(str, missing))})" if missing else ""
