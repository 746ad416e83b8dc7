"""What the ranks' own reports say went wrong, and where: the first non-finite loss (trainer/watch.py reports it as
points under wire.NONFINITE_*_KEY), read back for the run page and the API in the same words as the trainer's log;
and stragglers, from each rank's data-wait and compute times per step (wire.RANK_TIME_KEYS).

A straggler in synchronous DDP does not show in step times: every rank waits for the slowest in the gradient
all-reduce, so all steps last alike, and the others' wait is counted in their compute time. What differs is the
part of the step the slow rank spends on its own: its data wait, above the others' median by a clear margin over
STREAK reports in a row (each report is an average over wire.RANK_TIMES_EVERY steps, so one slow batch is not
enough). A rank whose compute stays above the others' is flagged "compute" the same way (ranks that do not wait
for each other every step, or a script that times compute without its collectives)."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime
from statistics import fmean, median
from typing import Literal

from rankboard import wire
from sqlalchemy.orm import Session

from app.core.errors import RunNotFound
from app.core.models import Run
from app.schemas.forensics import DivergenceOut, FindingsOut, NonFiniteOut, StragglerOut
from app.services import gpu_health
from app.store import findings as findings_store
from app.store import metrics as metric_store
from app.store import ranks as rank_store
from app.store import runs as run_store

MAX_RANKS_NAMED = 64
STREAK = 3  # reports in a row
MARGIN_MS = 5.0  # above the others' median by at least this, and by at least MARGIN_SHARE of the median step
MARGIN_SHARE = 0.2
LOOK_BACK = 60  # reports
PARTS: dict[str, Literal["data wait", "compute"]] = {
    wire.RANK_TIME_KEYS[1]: "data wait",
    wire.RANK_TIME_KEYS[2]: "compute",
}


def run_findings(db: Session, *, run_id: int) -> FindingsOut:
    """The findings of the run with this id; raises RunNotFound."""
    run = run_store.get_run(db, run_id)
    if run is None:
        raise RunNotFound(run_id)
    return findings(db, run=run)


def findings(db: Session, *, run: Run) -> FindingsOut:
    """Everything found about the run's ranks so far."""
    return FindingsOut(nonfinite=nonfinite(db, run=run), stragglers=stragglers(db, run=run),
                       divergence=divergence(db, run=run))  # fmt: skip


def divergence(db: Session, *, run: Run) -> DivergenceOut | None:
    """The first fingerprint step at which some ranks' replicas differed, naming them; None while they agree."""
    points = _first_step(db, run=run, key=wire.DIVERGENCE_KEY)
    if not points:
        return None
    ranks = [point.rank for point in points]
    return DivergenceOut(step=points[0].step, ranks=ranks, sentence=wire.divergence_sentence(points[0].step, ranks))


def stragglers(db: Session, *, run: Run) -> list[StragglerOut]:
    """Each rank whose data wait or compute stayed above the others' over STREAK reports, with when it began; the
    ones still slow at the newest report first. Over the newest LOOK_BACK reports."""
    hosts = {row.rank: row.host for row in rank_store.rank_rows(db, run_id=run.id)}
    limit = LOOK_BACK * len(wire.RANK_TIME_KEYS) * max(len(hosts), run.nproc_per_node)
    rows = findings_store.newest_points(db, run_id=run.id, keys=wire.RANK_TIME_KEYS, limit=limit)
    reports: dict[int, dict[str, dict[int, float]]] = {}
    times: dict[int, float] = {}
    for key, step, rank, value, at in rows:
        if value is not None:
            reports.setdefault(step, {}).setdefault(key, {})[rank] = value
            times[step] = at
    steps = sorted(step for step, parts in reports.items() if len(parts.get(wire.RANK_TIME_KEYS[0], {})) >= 2)
    data, compute = PARTS
    waited = {step for step in steps if _slow_ranks(reports[step], data)}  # the others' compute holds that wait
    found = _streaks(steps, reports, data, times, hosts) + _streaks(steps, reports, compute, times, hosts, waited)
    found = gpu_health.with_gpu_causes(db, run=run, stragglers=found)  # a throttled GPU under a slow rank
    return sorted(found, key=lambda s: (not s.ongoing, s.since_step))


def _slow_ranks(report: dict[str, dict[int, float]], key: str) -> dict[int, float]:
    """The ranks above the others' median in this part of one report, with the others' median."""
    part, total = report.get(key, {}), report[wire.RANK_TIME_KEYS[0]]
    margin = max(MARGIN_MS, MARGIN_SHARE * median(total.values()))
    if len(part) < 2:
        return {}
    ordered = sorted(part.values())
    slow = {}
    for rank, value in part.items():
        others = _median_without(ordered, value)
        if value - others > margin:
            slow[rank] = others
    return slow


def _median_without(ordered: list[float], value: float) -> float:
    """The median of the sorted values less one occurrence of `value`, as statistics.median gives it, read off the
    whole sorted list: the others sorted anew for each rank made 60 reports of 1,024 ranks take 5 s, now 0.1 s."""
    gone, count = bisect_left(ordered, value), len(ordered) - 1  # any equal one: the others are the same values

    def at(index: int) -> float:  # the others' index-th value
        return ordered[index] if index < gone else ordered[index + 1]

    middle = count // 2
    return at(middle) if count % 2 else (at(middle - 1) + at(middle)) / 2


def _streaks(
    steps: list[int], reports: dict[int, dict[str, dict[int, float]]], key: str, times: dict[int, float],
    hosts: dict[int, str], masked: AbstractSet[int] = frozenset(),
) -> list[StragglerOut]:  # fmt: skip
    """The episodes of one part (data wait or compute) in which one rank stayed above the others; a masked report
    ends every streak."""
    runs: dict[int, list[tuple[int, float, float]]] = {}  # rank -> its current streak: (step, its ms, others' ms)
    episodes: list[StragglerOut] = []
    for index, step in enumerate(steps):
        slow = {} if step in masked else _slow_ranks(reports[step], key)
        for rank in sorted(set(slow) | set(runs)):
            if rank in slow:
                runs.setdefault(rank, []).append((step, reports[step][key][rank], slow[rank]))
                continue
            streak = runs.pop(rank, [])
            if len(streak) >= STREAK:
                episodes.append(_episode(rank, key, streak, times, hosts, until=steps[index]))
    episodes += [_episode(rank, key, s, times, hosts, until=None) for rank, s in runs.items() if len(s) >= STREAK]
    return episodes


def _episode(
    rank: int, key: str, streak: list[tuple[int, float, float]], times: dict[int, float], hosts: dict[int, str],
    until: int | None,
) -> StragglerOut:  # fmt: skip
    since, mine, others = streak[0][0], fmean(s[1] for s in streak), fmean(s[2] for s in streak)
    host, part = hosts.get(rank, "an unknown node"), PARTS[key]
    when = "still" if until is None else f"until step {until:,}"
    sentence = (f"rank {rank} on {host} is slow in {part}: {mine:.0f} ms a step against the others' {others:.0f} ms, "
                f"since step {since:,} ({when})")  # fmt: skip
    return StragglerOut(rank=rank, host=host, part=part, ms=mine, others_ms=others, since_step=since,
                        since=datetime.fromtimestamp(times[since], UTC), until_step=until, ongoing=until is None,
                        sentence=sentence)  # fmt: skip


def nonfinite(db: Session, *, run: Run) -> NonFiniteOut | None:
    """Where the loss (or the gradient norm) first became NaN or infinite, and on which ranks; None while finite."""
    losses = _first_step(db, run=run, key=wire.NONFINITE_LOSS_KEY)
    norms = _first_step(db, run=run, key=wire.NONFINITE_GRAD_NORM_KEY)
    if not losses and not norms:
        return None
    norm_step = norms[0].step if norms else None
    norm = _word(norms[0].value) if norms else ""
    if not losses:
        sentence = f"gradient norm became {norm} at step {norm_step:,} (the loss still finite)"
        return NonFiniteOut(step=None, ranks=[], grad_norm_step=norm_step, sentence=sentence)
    step, ranks = losses[0].step, [point.rank for point in losses]
    sentence = wire.nonfinite_sentence(step, ranks, _word(losses[0].value), norm_step, norm)
    return NonFiniteOut(step=step, ranks=ranks, grad_norm_step=norm_step, sentence=sentence)


def _first_step(db: Session, *, run: Run, key: str) -> list[metric_store.SeriesPoint]:
    points = metric_store.points_in_range(
        db, run_id=run.id, key=key, start_step=0, start_rank=0, end_step=None, limit=MAX_RANKS_NAMED
    )
    return [point for point in points if point.step == points[0].step]


def _word(value: float | None) -> str:
    return wire.number_word(math.nan if value is None else value)  # the store keeps NaN as NULL
