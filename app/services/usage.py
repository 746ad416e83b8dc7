"""Usage: what runs held and cost over a period, by user, tag or launcher, and by ISO week.

Each run's cost is app.services.cost's, from its goodput ledger and its GPU samples; each launch counts by its overlap
with the period [start, end), pro-rated (its hours, energy and money alike), and its weeks the same way. A run
with several tags counts in each tag's row, one without under NO_TAG; the total counts each run once. Goodput is
over the runs that itemize their time (the built-in trainer's): a script's run neither counts as 0% nor hides it.

Who sees what: a viewer reads every run (app.auth.policy: reading needs the viewer role, and runs are not private),
so usage counts every run the runs list shows, archived ones too (they held their GPUs all the same), and none that
is being deleted.
"""

from __future__ import annotations

import csv
import io
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import NamedTuple

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from app.core.models import Run, utcnow
from app.schemas.goodput import Goodput
from app.schemas.usage import EnergyMethod, GroupBy, RunCost, Usage, UsageRow, UsageWeek
from app.services import cost, goodput
from app.services.goodput import run_goodput
from app.store import usage as usage_store
from app.store.goodput import LEDGER_PREFIX

NO_TAG = "(no tag)"
NO_USER = "(unknown)"
ALL = "(all)"
CSV_COLUMNS = ("group", "runs", "gpu_hours", "cpu_hours", "kwh", "cost", "unpriced_gpu_hours", "goodput")
WEEK = timedelta(days=7)
SETTLED = timedelta(minutes=10)  # after a run's end, its last batches have arrived
KEPT_RUNS = 200_000  # runs' measures kept: each a few hundred bytes


@dataclass
class Tally:
    """A group's sums so far."""

    runs: set[int] = field(default_factory=set)
    gpu_hours: float = 0.0
    cpu_hours: float = 0.0
    kwh: float | None = None
    cost: float | None = None
    unpriced: float = 0.0
    trained: float = 0.0  # device-hours of training, of itemized runs
    itemized: float = 0.0  # device-hours of itemized runs

    def add(self, run: RunCost, hours: float, kwh: float | None) -> None:
        """`hours` of the run's device-hours (within the period), which drew `kwh`."""
        self.runs.add(run.run_id)
        if run.device == "gpu":
            self.gpu_hours += hours
            self.unpriced += hours if run.price_per_hour is None else 0.0
        else:
            self.cpu_hours += hours
        if kwh is not None:
            self.kwh = (self.kwh or 0.0) + kwh
        if run.price_per_hour is not None:
            self.cost = (self.cost or 0.0) + hours * run.price_per_hour
        if run.goodput is not None:
            self.trained += hours * run.goodput
            self.itemized += hours

    def row(self, group: str) -> UsageRow:
        return UsageRow(group=group, runs=len(self.runs), gpu_hours=self.gpu_hours, cpu_hours=self.cpu_hours,
                        kwh=self.kwh, cost=self.cost, unpriced_gpu_hours=self.unpriced,
                        goodput=self.trained / self.itemized if self.itemized > 0 else None)  # fmt: skip


def usage(
    db: Session, *, by: GroupBy, start: datetime | None, end: datetime | None, prices: Mapping[str, float],
) -> Usage:  # fmt: skip
    """Usage by `by` over [start, end) (end: now if None), in one read transaction."""
    now = utcnow()
    end = min(end or now, now)
    with db.begin():
        runs = usage_store.runs_in_period(db, start=start, end=end)
        measured = _measure(db, runs, now=now)
        tags = usage_store.tags_of(db, run_ids=[run.id for run in runs]) if by == "tag" else {}
        groups: dict[str, Tally] = defaultdict(Tally)
        weeks: dict[tuple[date, str], Tally] = defaultdict(Tally)
        total = Tally()
        for run in runs:
            seen = measured[run.id]
            spent = cost.assemble(run, seen.goodput, seen.windows, seen.joules, seen.method, prices=prices)
            _count(run, spent, seen.windows, names=_groups(run, by, tags), start=start, end=end,
                   tallies=(groups, weeks, total))  # fmt: skip
    rows = sorted((tally.row(name) for name, tally in groups.items()), key=lambda r: (-r.gpu_hours, -r.cpu_hours,
                                                                                        r.group))  # fmt: skip
    return Usage(by=by, start=start, end=end, rows=rows, total=total.row(ALL), weeks=_weeks(weeks))


class Measured(NamedTuple):
    """What a run's cost is made of, before the prices: its goodput, launches and their GPUs' energy."""

    goodput: Goodput
    windows: list[cost.Window]
    joules: list[float | None]
    method: EnergyMethod


class Kept:
    """The measures of runs that ended a while ago, by database, run and end (a resumed run ends again later): their
    ledgers and samples no longer change, and a report over thousands of runs would read every power sample of each,
    each time (bench/usage.py)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.found: OrderedDict[tuple[str, int, float], Measured] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple[str, int, float]) -> Measured | None:
        with self.lock:
            found = self.found.get(key)
            if found is not None:
                self.found.move_to_end(key)
            return found

    def put(self, key: tuple[str, int, float], measured: Measured) -> None:
        with self.lock:
            self.found[key] = measured
            while len(self.found) > self.size:
                self.found.popitem(last=False)


KEPT = Kept(KEPT_RUNS)


def _measure(db: Session, runs: Sequence[Run], *, now: datetime) -> dict[int, Measured]:
    """Each run's goodput, launches and energy. A run over for SETTLED (the points sent just before its end have
    arrived) is kept measured; the others' events, ledgers and samples are read in bulk, and a run with no ledger is
    laid out without reading one."""
    database = str(db.get_bind().engine.url)
    keys = {
        run.id: (database, run.id, run.finished_at.timestamp())
        for run in runs
        if run.finished_at and _settled(run, now)
    }
    found = {run_id: kept for run_id, key in keys.items() if (kept := KEPT.get(key)) is not None}
    missing = [run for run in runs if run.id not in found]
    ids = [run.id for run in missing]
    events = usage_store.events_of(db, run_ids=ids)
    series = usage_store.energy_series(db, run_ids=ids)
    ledgered = usage_store.runs_with_series(db, run_ids=ids, prefix=LEDGER_PREFIX)
    for run in missing:
        set_committed_value(run, "events", events.get(run.id, []))  # as a bulk load would: no query per run
        laid = run_goodput(db, run=run, now=now) if run.id in ledgered else goodput.compute(
            run, list(run.events), [], now=now)  # fmt: skip
        windows = cost.windows_of(run, now=now)
        found[run.id] = Measured(laid, windows, *cost.gpu_energy(db, series.get(run.id, {}), windows))
        if run.id in keys:
            KEPT.put(keys[run.id], found[run.id])
    return found


def _settled(run: Run, now: datetime) -> bool:
    return run.status.is_final and run.finished_at is not None and now - run.finished_at > SETTLED


def _groups(run: Run, by: GroupBy, tags: Mapping[int, list[str]]) -> list[str]:
    if by == "user":
        return [run.owner or run.created_by or NO_USER]
    if by == "tag":
        return tags.get(run.id) or [NO_TAG]
    return [run.launcher]


def _count(
    run: Run, spent: RunCost, windows: list[cost.Window], *, names: list[str], start: datetime | None, end: datetime,
    tallies: tuple[dict[str, Tally], dict[tuple[date, str], Tally], Tally],
) -> None:  # fmt: skip
    """Adds each launch's overlap with the period to the run's groups, its weeks and the total."""
    groups, weeks, total = tallies
    low = start.timestamp() if start is not None else float("-inf")
    for window, attempt in zip(windows, spent.attempts, strict=True):
        length = window.end - window.launch
        for week, (begin, finish) in _week_pieces(max(window.launch, low), min(window.end, end.timestamp())):
            fraction = (finish - begin) / length if length > 0 else 0.0
            hours, kwh = attempt.device_hours * fraction, None if attempt.kwh is None else attempt.kwh * fraction
            for tally in (*(groups[name] for name in names), *(weeks[week, name] for name in names), total):
                tally.add(spent, hours, kwh)


def _week_pieces(begin: float, end: float) -> list[tuple[date, tuple[float, float]]]:
    """[begin, end) in unix seconds cut at each Monday 00:00 UTC, each piece with its week's Monday."""
    pieces: list[tuple[date, tuple[float, float]]] = []
    if end <= begin:
        return pieces
    day = datetime.fromtimestamp(begin, timezone.utc).date()
    monday = datetime.combine(day - timedelta(days=day.weekday()), datetime.min.time(), timezone.utc)
    while monday.timestamp() < end:
        after = monday + WEEK
        piece = (max(begin, monday.timestamp()), min(end, after.timestamp()))
        if piece[1] > piece[0]:
            pieces.append((monday.date(), piece))
        monday = after
    return pieces


def _weeks(weeks: dict[tuple[date, str], Tally]) -> list[UsageWeek]:
    found = []
    for (monday, name), tally in sorted(weeks.items()):
        year, number, _ = monday.isocalendar()
        found.append(UsageWeek(week=f"{year}-W{number:02d}", starts=monday, group=name, gpu_hours=tally.gpu_hours,
                               cpu_hours=tally.cpu_hours, kwh=tally.kwh, cost=tally.cost))  # fmt: skip
    return found


def as_csv(report: Usage) -> str:
    """The usage table as CSV with a header, the total last; empty cells where a figure is unknown."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in [*report.rows, report.total]:
        values = row.model_dump()
        writer.writerow(["" if values[name] is None else _cell(values[name]) for name in CSV_COLUMNS])
    return out.getvalue()


def _cell(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def weekly_chart(report: Usage) -> dict[str, object]:
    """The weeks as the page's stacked chart draws them: the weeks' Mondays (unix s), and each group's GPU-hours
    (CPU-hours where the period holds no GPU-hours) per week, the biggest group first."""
    gpu = any(week.gpu_hours > 0 for week in report.weeks)
    mondays = sorted({week.starts for week in report.weeks})
    at = {monday: index for index, monday in enumerate(mondays)}
    names = [row.group for row in report.rows]
    values = {name: [0.0] * len(mondays) for name in names}
    for week in report.weeks:
        values[week.group][at[week.starts]] += week.gpu_hours if gpu else week.cpu_hours
    stamps = [datetime.combine(monday, datetime.min.time(), timezone.utc).timestamp() for monday in mondays]
    return {"unit": "GPU-hours" if gpu else "CPU-hours", "weeks": stamps,
            "groups": [{"name": name, "values": values[name]} for name in names]}  # fmt: skip


class Spent(NamedTuple):
    """What runs held and drew so far: GPU-hours, CPU-hours, joules."""

    gpu_hours: float
    cpu_hours: float
    joules: float

    def plus(self, other: Spent) -> Spent:
        return Spent(self.gpu_hours + other.gpu_hours, self.cpu_hours + other.cpu_hours, self.joules + other.joules)


class Totals:
    """Every run's use in all, for /metrics: the runs that ended a while ago summed once and kept until one more ends,
    is resumed or goes away (one query says so), the others summed at each scrape."""

    def __init__(self) -> None:
        self.mark: tuple[object, ...] | None = None
        self.ended = Spent(0.0, 0.0, 0.0)
        self.lock = threading.Lock()

    def read(self, db: Session, *, now: datetime) -> tuple[Spent, dict[int, Spent]]:
        """The total, and each run's that has not settled (the live ones among them), as of `now`."""
        before = now - SETTLED
        mark = (str(db.get_bind().engine.url), *usage_store.settled_mark(db, ended_before=before))
        with self.lock:
            if mark != self.mark:
                self.ended = _spent(db, usage_store.settled(db, ended_before=before), now=now)[0]
                self.mark = mark
            ended = self.ended
        total, each = _spent(db, usage_store.unsettled(db, ended_before=before), now=now)
        return ended.plus(total), each


TOTALS = Totals()


def _spent(db: Session, runs: Sequence[Run], *, now: datetime) -> tuple[Spent, dict[int, Spent]]:
    """These runs' use, in all and each."""
    measured = _measure(db, runs, now=now)
    each = {}
    for run in runs:
        seen = measured[run.id]
        held = cost.held_by(run)
        hours = held.units * sum(w.end - w.launch for w in seen.windows) / 3600
        joules = sum(j for j in seen.joules if j is not None)
        each[run.id] = Spent(hours, 0.0, joules) if held.gpus else Spent(0.0, hours, joules)
    return Spent(*(sum(spent[i] for spent in each.values()) for i in range(3))), each
