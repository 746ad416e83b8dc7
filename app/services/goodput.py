"""Goodput: how much of the time a run held its processes went into training, and where the rest went.

The whole is the run's wall time (from creation to its end, less any time it sat stopped before a resume) times its
processes. Each rank's share of it is laid out on a timeline, so the parts add up to the whole by construction:

- from each queueing (creation, resume, requeue) to the launch: waiting in the queue;
- from the launch to the rank's first trainer process: start-up (the launcher, the interpreter, the imports);
- each trainer process's own ledger (trainer/goodput.py): start-up phases, data wait, steps, checkpoints, validation;
- between one process's last report and the next one's start: restarts (the work lost and the re-launch);
- the steps a restarted process took again, having been done before the crash: repeated steps, out of its steps;
- "not progressing" episodes (the health check's events): stalls, out of the steps they overlap;
- a preemption (a higher-priority run asked it to stop): from its last report to its requeue, and its wait in the
  queue until the next launch: preempted, the time it lost to the other run;
- after the last report to the end: stopping and exit; while the run is live, "since the last report".

A rank that sent no ledger (a user's script, a run launched elsewhere: only the built-in trainer keeps one) shows
its held time as not itemized, less what the server knows without one: the queue and the stalls. Such a run has no
goodput figure (None, `itemized` False): its training is not told apart from its data waits, checkpoints and
restarts, and a 0% would blame it for time it may well have trained. Ledger times are the nodes' clocks and events
the server's: each process's span is clamped into its launch window, so a small skew moves time between neighbouring
parts but never makes the sum wrong.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from rankboard import wire
from sqlalchemy.orm import Session

from app.core.errors import RunNotFound
from app.core.models import FINAL_STATUSES, Run, RunEvent, RunStatus, utcnow
from app.launcher.launchers import kind, trains_builtin
from app.schemas.goodput import Goodput, GoodputPart
from app.services import health
from app.services.scheduling import PREEMPTED
from app.store import goodput as goodput_store
from app.store import runs as run_store

# The parts, in the order the bar shows them, with what a person reads; "training" is the good one.
PART_LABELS = {
    "training": "training (new steps)",
    "queue": "waiting in the queue",
    "startup": "start-up",
    "data": "data wait",
    "checkpoint": "checkpoint writes",
    "validation": "validation",
    "restarts": "restarts (lost work, re-launch)",
    "preempted": "preempted (stopping, waiting to resume)",
    "repeated": "steps repeated after a restart",
    "stalls": "stalls (not progressing)",
    "stopping": "stopping and exit",
    "pending": "since the last report (live)",
    "unitemized": "not itemized (no timings from the trainer)",
}
STARTUP_PHASES = {
    "startup_launch": "launcher, interpreter and imports",
    "startup_group": "joining the process group",
    "startup_build": "data, model and snapshot",
    "startup_preflight": "preflight check",
}
STEP_KEY = "loss"  # the built-in trainer logs it at every step, from rank 0
SKEW_S = 60.0  # how far a node's clock may be from the server's for a process to count in a launch window
SUMMARY_LIMIT = 500


@dataclass
class _Ledger:
    attempt: str
    rank: int
    values: dict[str, float]

    @property
    def start(self) -> float:
        return self.values.get("start", 0.0)

    @property
    def at(self) -> float:
        return self.values.get("at", self.start)


@dataclass(frozen=True)
class _Segment:
    """One stretch from a queueing to the end of the processes it launched."""

    start: float
    launch: float | None
    end: float
    live: bool
    preempted: bool = False  # it ended because a higher-priority run asked it to stop: its tail is preemption's
    after_preemption: bool = False  # it began with that requeue: its wait in the queue is preemption's


def run_goodput(db: Session, *, run: Run, now: datetime | None = None) -> Goodput:
    """The goodput of `run` as of `now` (its end, once final)."""
    ledgers = _ledgers(goodput_store.latest_ledger_values(db, run_id=run.id))
    # A killed process's last ledger report may be up to GOODPUT_REPORT_S old: the loss it logged at every step
    # says how far it really got before its successor started.
    starts = sorted({min(lg.start for lg in ledgers if lg.attempt == a) for a in {lg.attempt for lg in ledgers}})
    reached = {start: goodput_store.highest_step_before(db, run_id=run.id, key=STEP_KEY, before=start)
               for start in starts[1:]}  # fmt: skip
    return compute(run, list(run.events), ledgers, now=now or utcnow(), reached_before=reached)


def goodput_of(db: Session, *, run_id: int) -> Goodput:
    """The goodput of the run with this id, now; raises RunNotFound."""
    run = run_store.get_run(db, run_id)
    if run is None:
        raise RunNotFound(run_id)
    return run_goodput(db, run=run)


def summary(db: Session, *, since_hours: float | None, name_prefix: str) -> Goodput:
    """The goodput of the runs created in the last `since_hours` (all if None) whose names start with the prefix."""
    now = utcnow()
    since = now - timedelta(hours=since_hours) if since_hours is not None else None
    runs = goodput_store.runs_for_summary(db, since=since, name_prefix=name_prefix, limit=SUMMARY_LIMIT)
    return combine([run_goodput(db, run=run, now=now) for run in runs])


def compute(
    run: Run, events: list[RunEvent], ledgers: list[_Ledger], *, now: datetime,
    reached_before: dict[float, int] | None = None,
) -> Goodput:  # fmt: skip
    """Lay every rank's ledgers on the run's lifecycle; pure, so that it can be checked by hand. `reached_before`:
    the highest step taken before each of these unix times (a process incarnation's start), besides the ledgers'."""
    ranks = max([kind(run.launcher).ranks(run), *(ledger.rank + 1 for ledger in ledgers)])
    segments = _segments(run, events, now=now.timestamp())
    stalls = _stalls(events, now=now.timestamp())
    repeated = _repeated_steps(ledgers, reached_before or {})
    seconds: dict[str, float] = defaultdict(float)
    # Each process's ledger in the one stretch it ran in: a relaunch soon after a requeue (a preemption, Slurm's)
    # starts within the skew allowed around the stretch before it, which must not take it.
    by_stretch: dict[tuple[int, int], list[_Ledger]] = defaultdict(list)
    for ledger in ledgers:
        by_stretch[ledger.rank, _stretch_of(ledger, segments)].append(ledger)
    laid = [_lay_rank(seconds, segment, by_stretch.get((rank, index), []), stalls, repeated)
            for rank in range(ranks) for index, segment in enumerate(segments)]  # fmt: skip
    wall = sum(segment.end - segment.start for segment in segments)
    phases = {name: value for name in STARTUP_PHASES if (value := seconds.pop(name, 0.0)) > 0}
    seconds["startup"] += sum(phases.values())
    # Before its launch, a run of a script is known not to itemize its time: its page says so from the start.
    itemized = all(laid) and (bool(ledgers) or trains_builtin(run))
    return _goodput(seconds, wall=wall, processes=ranks, phases=phases,
                    repeated_steps=sum(repeated.values()), itemized=itemized)  # fmt: skip


def combine(each: list[Goodput]) -> Goodput:
    """The goodput of a set of runs: their parts and wholes summed; its figure over the itemized runs only, so that
    runs of scripts (no ledger) neither count as 0% nor hide the figure of the others."""
    seconds: dict[str, float] = defaultdict(float)
    phases: dict[str, float] = defaultdict(float)
    for one in each:
        for part in one.parts:
            seconds[part.name] += part.seconds
        for name, value in one.startup_phases.items():
            phases[name] += value
    wall = sum(one.wall_s for one in each)
    result = _goodput(seconds, wall=wall, processes=sum(one.processes for one in each), phases=dict(phases),
                      repeated_steps=sum(one.repeated_steps for one in each),
                      itemized=all(one.itemized for one in each))  # fmt: skip
    counted = [one for one in each if one.itemized]
    whole = sum(one.total_s for one in counted)
    trained = sum(part.seconds for one in counted for part in one.parts if part.name == "training")
    return result.model_copy(update={"runs": len(each), "goodput": trained / whole if whole > 0 else None})


def _goodput(
    seconds: dict[str, float], *, wall: float, processes: int, phases: dict[str, float], repeated_steps: int,
    itemized: bool,
) -> Goodput:  # fmt: skip
    total = sum(seconds.values())
    parts = [
        GoodputPart(name=name, label=label, seconds=seconds[name], share=seconds[name] / total if total > 0 else 0.0)
        for name, label in PART_LABELS.items()
        if seconds.get(name, 0.0) > 0 or (name == "training" and itemized)  # not itemized: training is not known
    ]
    good = seconds.get("training", 0.0) / total if total > 0 and itemized else None
    return Goodput(processes=processes, wall_s=wall, total_s=total, parts=parts, goodput=good, startup_phases=phases,
                   repeated_steps=repeated_steps, itemized=itemized)  # fmt: skip


def _ledgers(rows: list[tuple[str, int, float | None]]) -> list[_Ledger]:
    """Each process's latest totals, from `goodput/<attempt>/<field>` points."""
    found: dict[tuple[str, int], _Ledger] = {}
    for key, rank, value in rows:
        _prefix, attempt, name = key.split("/", 2) if key.count("/") == 2 else ("", "", "")
        if not attempt or value is None or name not in (*wire.GOODPUT_PARTS, *wire.GOODPUT_MARKS):
            continue
        found.setdefault((attempt, rank), _Ledger(attempt, rank, {})).values[name] = value
    return [ledger for ledger in found.values() if "start" in ledger.values and "at" in ledger.values]


def _segments(run: Run, events: list[RunEvent], *, now: float) -> list[_Segment]:
    """The stretches from each queueing to the end of its processes; the time a run sat final is in none."""
    segments: list[_Segment] = []
    start: float | None = None
    launch: float | None = None
    after = False  # the stretch under way began with a preemption's requeue
    for event in events:
        at = event.at.timestamp()
        if start is None:  # created, resumed (queued), or a first event of another kind: a stretch begins
            start = min(at, run.created_at.timestamp()) if not segments else at
        if event.status == RunStatus.queued and launch is not None:  # requeued (Slurm, preempted): processes ended
            preempted = event.reason.startswith(PREEMPTED)
            segments.append(_Segment(start, launch, at, live=False, preempted=preempted, after_preemption=after))
            start, launch, after = at, None, preempted
        elif event.status in (RunStatus.starting, RunStatus.running, RunStatus.stopping) and launch is None:
            launch = at
        elif event.status in FINAL_STATUSES:
            segments.append(_Segment(start, launch, max(at, start), live=False, after_preemption=after))
            start, launch, after = None, None, False
    if start is not None or not segments:
        begin = start if start is not None else run.created_at.timestamp()
        segments.append(_Segment(begin, launch, max(now, begin), live=True, after_preemption=after))
    return segments


def _stretch_of(ledger: _Ledger, segments: list[_Segment]) -> int:
    """The stretch a process ran in: the latest launched (within the clocks' skew) before it started."""
    launched = [i for i, s in enumerate(segments) if s.launch is not None and s.launch - SKEW_S <= ledger.start]
    return launched[-1] if launched else 0


def _stalls(events: list[RunEvent], *, now: float) -> list[tuple[float, float]]:
    """The health check's "not progressing" episodes, each up to "progressing again" or the run's next status."""
    episodes: list[tuple[float, float]] = []
    began: float | None = None
    for event in events:
        at = event.at.timestamp()
        if event.reason.startswith(health.NOT_PROGRESSING) and began is None:
            began = at
        elif began is not None and (
            event.reason.startswith(health.PROGRESSING_AGAIN) or event.status != RunStatus.running
        ):
            episodes.append((began, at))
            began = None
    if began is not None:
        episodes.append((began, now))
    return episodes


def _repeated_steps(ledgers: list[_Ledger], reached_before: dict[float, int]) -> dict[str, int]:
    """Per process incarnation, how many of its steps an earlier one had already taken (lost to a restart)."""
    first_seen: dict[str, float] = {}
    reached: dict[str, float] = defaultdict(float)
    began: dict[str, float] = {}
    for ledger in ledgers:
        first_seen[ledger.attempt] = min(first_seen.get(ledger.attempt, ledger.start), ledger.start)
        reached[ledger.attempt] = max(reached[ledger.attempt], ledger.values.get("step_reached", 0.0))
        began[ledger.attempt] = ledger.values.get("first_step", 0.0)
    repeated: dict[str, int] = {}
    high = 0.0
    for attempt in sorted(first_seen, key=first_seen.__getitem__):
        high = max(high, reached_before.get(first_seen[attempt], 0))
        repeated[attempt] = int(max(0.0, min(high, reached[attempt]) - began[attempt]))
        high = max(high, reached[attempt])
    return repeated


def _lay_rank(
    seconds: dict[str, float], segment: _Segment, ledgers: list[_Ledger], stalls: list[tuple[float, float]],
    repeated: dict[str, int],
) -> bool:  # fmt: skip
    """Add one rank's share of one segment to `seconds`: queue, then its processes in order, then the tail. False
    where its processes sent no ledger, so that their time is not itemized."""
    queue = "preempted" if segment.after_preemption else "queue"
    if segment.launch is None:
        seconds[queue] += segment.end - segment.start
        return True
    seconds[queue] += segment.launch - segment.start
    mine = sorted((lg for lg in ledgers if segment.launch - SKEW_S <= lg.start <= segment.end + SKEW_S),
                  key=lambda lg: lg.start)  # fmt: skip
    if not mine:  # the stalls are the health check's events: known without a ledger
        stalled = _overlap(stalls, segment.launch, segment.end)
        seconds["stalls"] += stalled
        seconds["unitemized"] += segment.end - segment.launch - stalled
        return False
    cursor = segment.launch
    for index, ledger in enumerate(mine):
        begin = min(max(ledger.start, cursor), segment.end)
        end = min(max(ledger.at, begin), segment.end)
        seconds["startup_launch" if index == 0 else "restarts"] += begin - cursor
        _lay_ledger(seconds, ledger, begin, end, stalls, repeated.get(ledger.attempt, 0))
        cursor = end
    tail = "pending" if segment.live else "preempted" if segment.preempted else "stopping"
    seconds[tail] += segment.end - cursor
    return True


def _overlap(spans: list[tuple[float, float]], begin: float, end: float) -> float:
    """How long the spans (not overlapping each other) cover of [begin, end]."""
    return sum(max(0.0, min(e, end) - max(b, begin)) for b, e in spans)


def _lay_ledger(
    seconds: dict[str, float], ledger: _Ledger, begin: float, end: float, stalls: list[tuple[float, float]],
    repeated_steps: int,
) -> None:  # fmt: skip
    """One process's parts, scaled to its clamped span; stalls and repeated steps taken out of its steps."""
    parts = {name: max(0.0, ledger.values.get(name, 0.0)) for name in wire.GOODPUT_PARTS}
    reported = sum(parts.values())
    scale = (end - begin) / reported if reported > 0 else 0.0
    if reported <= 0:
        seconds["startup_launch"] += end - begin
        return
    parts = {name: value * scale for name, value in parts.items()}
    stalled = min(parts["step"], _overlap(stalls, begin, end))
    parts["step"] -= stalled
    seconds["stalls"] += stalled
    taken = ledger.values.get("step_reached", 0.0) - ledger.values.get("first_step", 0.0)
    if repeated_steps and taken > 0:
        fraction = min(1.0, repeated_steps / taken)
        seconds["repeated"] += fraction * (parts["step"] + parts["data"])
        parts["step"], parts["data"] = (1 - fraction) * parts["step"], (1 - fraction) * parts["data"]
    seconds["training"] += parts.pop("step")
    for name, value in parts.items():
        seconds[name] += value
