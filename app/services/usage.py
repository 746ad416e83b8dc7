"""Usage: what runs held and cost over a period, by user, tag or launcher, and by ISO week.

Each run's cost is app.services.cost's, from its goodput ledger and its GPU samples; each launch counts by its overlap
with the period [start, end), pro-rated (its hours, energy and money alike), and its weeks the same way. A run
with several tags counts in each tag's row, one without under NO_TAG; the total counts each run once. Goodput is
over the runs that itemize their time (the built-in trainer's): a script's run neither counts as 0% nor hides it.

Who sees what: a viewer reads every run (app.auth.policy: reading needs the viewer role, and runs are not private),
so usage counts every run the runs list shows, archived ones too (they held their GPUs all the same), and none that
is being deleted.

A run settled (ended SETTLED ago: the batches sent before its end have arrived, its ledger and samples no longer
change) is measured once and its launches stored in run_costs (app.core.models.LaunchCost), by the first report or
/metrics scrape that finds it so, in whichever server process; a report then reads those rows in one query and
measures only the runs live or ended lately, as a report over thousands would otherwise read every power sample of
each (bench/usage.py). A run resumed since ends again later: its rows, stored for its earlier end, no longer match
its `finished_at`, and it is measured again once settled. Money is the stored GPU models at the admin's prices of
the day. The rows go with their run when it is deleted (a cascade).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import NamedTuple, cast

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from app.core.models import Run, utcnow
from app.schemas.goodput import Goodput
from app.schemas.usage import EnergyMethod, GroupBy, Usage, UsageRow, UsageWeek
from app.services import cost, goodput
from app.services.goodput import run_goodput
from app.store import usage as usage_store
from app.store.goodput import LEDGER_PREFIX

NO_TAG = "(no tag)"
NO_USER = "(unknown)"
ALL = "(all)"
CSV_COLUMNS = ("group", "runs", "gpu_hours", "cpu_hours", "kwh", "cost", "unpriced_gpu_hours", "goodput")
DAY_S = 86_400
WEEK_S = 7 * DAY_S
SETTLED = timedelta(minutes=10)  # after a run's end, its last batches have arrived
SETTLE_RUNS = 1_000  # runs measured, then stored, in one pair of transactions: memory and the write lock stay short


class Launch(NamedTuple):
    """One launch as a report counts it: its span (unix seconds), device-hours and energy, and its run's device and
    goodput. A stored launch is its run_costs row itself, which has these fields by name (no object per launch: a
    report counts thousands)."""

    run_id: int
    launched: float
    ended: float
    device: str
    device_hours: float
    kwh: float | None
    goodput: float | None


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

    def add(self, launch: Launch, price: float | None, hours: float, kwh: float | None) -> None:
        """`hours` of the launch's device-hours (within the period), which drew `kwh`, at `price` per hour."""
        self.runs.add(launch.run_id)
        if launch.device == "gpu":
            self.gpu_hours += hours
            self.unpriced += hours if price is None else 0.0
        else:
            self.cpu_hours += hours
        if kwh is not None:
            self.kwh = (self.kwh or 0.0) + kwh
        if price is not None:
            self.cost = (self.cost or 0.0) + hours * price
        if launch.goodput is not None:
            self.trained += hours * launch.goodput
            self.itemized += hours

    def row(self, group: str) -> UsageRow:
        return UsageRow(group=group, runs=len(self.runs), gpu_hours=self.gpu_hours, cpu_hours=self.cpu_hours,
                        kwh=self.kwh, cost=self.cost, unpriced_gpu_hours=self.unpriced,
                        goodput=self.trained / self.itemized if self.itemized > 0 else None)  # fmt: skip


Tallies = tuple[dict[str, Tally], dict[tuple[float, str], Tally], Tally]  # groups, (Monday, group), total


def usage(
    db: Session, *, by: GroupBy, start: datetime | None, end: datetime | None, prices: Mapping[str, float],
) -> Usage:  # fmt: skip
    """Usage by `by` over [start, end) (end: now if None): the settled runs' stored launches, the others measured."""
    now = utcnow()
    end = min(end or now, now)
    settle(db, now=now)
    with db.begin():
        launches, who, prices_of = _launches(db, start=start, end=end, now=now, prices=prices)
        tags = usage_store.tags_of(db, run_ids=list(who)) if by == "tag" else {}
    tallies: Tallies = (defaultdict(Tally), defaultdict(Tally), Tally())
    names = {run_id: _groups(run_id, people, by, tags) for run_id, people in who.items()}
    period = (start.timestamp() if start is not None else float("-inf"), end.timestamp())
    for launch in launches:
        _count(launch, prices_of[launch.run_id], names=names[launch.run_id], period=period, tallies=tallies)
    groups, weeks, total = tallies
    rows = sorted((tally.row(name) for name, tally in groups.items()), key=lambda r: (-r.gpu_hours, -r.cpu_hours,
                                                                                        r.group))  # fmt: skip
    return Usage(by=by, start=start, end=end, rows=rows, total=total.row(ALL), weeks=_weeks(weeks))


People = tuple[str | None, str | None, str]  # a run's owner, creator and launcher


def _launches(
    db: Session, *, start: datetime | None, end: datetime, now: datetime, prices: Mapping[str, float]
) -> tuple[list[Launch], dict[int, People], dict[int, float | None]]:
    """The launches of the period's runs, who launched each run, and its price per hour: the measured runs' as
    stored, priced at `prices`; the others' (live, ended lately) measured now."""
    before = now - SETTLED
    stored = usage_store.measured_launches(db, start=start, end=end, ended_before=before)
    rates: dict[str, float | None] = {}  # a price per set of GPU models: a report reads few
    prices_of = {row.run_id: _rate(row.gpu_models, prices, rates) for row in stored}
    who = {row.run_id: (row.owner, row.created_by, row.launcher) for row in stored}
    launches = cast(list[Launch], stored)  # rows with Launch's fields, by name
    runs = usage_store.unmeasured_in_period(db, start=start, end=end, ended_before=before)
    measured = _measure(db, runs, now=now)
    for run in runs:
        seen = measured[run.id]
        spent = cost.assemble(run, seen.goodput, seen.windows, seen.joules, seen.method, prices=prices)
        launches += [Launch(run.id, window.launch, window.end, spent.device, attempt.device_hours, attempt.kwh,
                            spent.goodput)
                     for window, attempt in zip(seen.windows, spent.attempts, strict=True)]  # fmt: skip
        who[run.id], prices_of[run.id] = (run.owner, run.created_by, run.launcher), spent.price_per_hour
    return launches, who, prices_of


def _rate(models: str, prices: Mapping[str, float], known: dict[str, float | None]) -> float | None:
    """The price per hour of the GPU models of this JSON text, worked out once per report."""
    if models not in known:
        known[models] = cost.mean_price(json.loads(models), prices)
    return known[models]


class Measured(NamedTuple):
    """What a run's cost is made of, before the prices: its goodput, launches and their GPUs' energy."""

    goodput: Goodput
    windows: list[cost.Window]
    joules: list[float | None]
    method: EnergyMethod


def _measure(db: Session, runs: Sequence[Run], *, now: datetime) -> dict[int, Measured]:
    """Each run's goodput, launches and energy: their events, ledgers and samples read in bulk, and a run with no
    ledger laid out without reading one."""
    ids = [run.id for run in runs]
    events = usage_store.events_of(db, run_ids=ids)
    series = usage_store.energy_series(db, run_ids=ids)
    ledgered = usage_store.runs_with_series(db, run_ids=ids, prefix=LEDGER_PREFIX)
    found = {}
    for run in runs:
        set_committed_value(run, "events", events.get(run.id, []))  # as a bulk load would: no query per run
        laid = run_goodput(db, run=run, now=now) if run.id in ledgered else goodput.compute(
            run, list(run.events), [], now=now)  # fmt: skip
        windows = cost.windows_of(run, now=now)
        found[run.id] = Measured(laid, windows, *cost.gpu_energy(db, series.get(run.id, {}), windows))
    return found


def settle(db: Session, *, now: datetime) -> int:
    """Measures the runs that ended SETTLED ago or more and have no launches stored since (each one once, or again
    after a resume), SETTLE_RUNS at a time, and stores their launches; returns how many runs it measured."""
    done, after = 0, 0
    while runs := _to_settle(db, now=now, after=after):
        after = runs[-1][0]
        try:
            with db.begin():
                usage_store.store_launches(db, run_ids=[run_id for run_id, _ in runs],
                                           rows=[row for _, rows in runs for row in rows])  # fmt: skip
        except IntegrityError:  # a run deleted meanwhile: its rows have no run to go with; the others wait
            continue
        done += len(runs)
    return done


def _to_settle(db: Session, *, now: datetime, after: int) -> list[tuple[int, list[dict[str, object]]]]:
    """The next runs to settle after id `after`, each with its launches' rows, read in one transaction."""
    with db.begin():
        runs = usage_store.to_measure(db, ended_before=now - SETTLED, after_id=after, limit=SETTLE_RUNS)
        measured = _measure(db, runs, now=now)
        return [(run.id, _rows(run, measured[run.id])) for run in runs]


def _rows(run: Run, seen: Measured) -> list[dict[str, object]]:
    """The run's launches as run_costs rows; one with no launch for a run that never launched."""
    spent = cost.assemble(run, seen.goodput, seen.windows, seen.joules, seen.method, prices={})
    held = cost.held_by(run)
    common: dict[str, object] = {
        "run_id": run.id, "run_ended_at": run.finished_at, "device": spent.device, "devices": spent.devices,
        "energy_method": spent.energy_method, "gpu_models": dict(Counter(held.models)) if held.gpus else {},
        "goodput": spent.goodput,
    }  # fmt: skip
    rows = [{**common, "attempt": index, "launched": window.launch, "ended": window.end,
             "device_hours": attempt.device_hours, "kwh": attempt.kwh}
            for index, (window, attempt) in enumerate(zip(seen.windows, spent.attempts, strict=True))]  # fmt: skip
    return rows or [{**common, "attempt": 0, "launched": None, "ended": None, "device_hours": 0.0, "kwh": None}]


def _groups(run_id: int, people: People, by: GroupBy, tags: Mapping[int, list[str]]) -> list[str]:
    owner, created_by, launcher = people
    if by == "user":
        return [owner or created_by or NO_USER]
    if by == "tag":
        return tags.get(run_id) or [NO_TAG]
    return [launcher]


def _count(launch: Launch, price: float | None, *, names: list[str], period: tuple[float, float],
           tallies: Tallies) -> None:  # fmt: skip
    """Adds the launch's overlap with the period (unix seconds) to the run's groups, its weeks and the total."""
    groups, weeks, total = tallies
    length = launch.ended - launch.launched
    for week, (begin, finish) in _week_pieces(max(launch.launched, period[0]), min(launch.ended, period[1])):
        fraction = (finish - begin) / length if length > 0 else 0.0
        hours, kwh = launch.device_hours * fraction, None if launch.kwh is None else launch.kwh * fraction
        for name in names:
            groups[name].add(launch, price, hours, kwh)
            weeks[week, name].add(launch, price, hours, kwh)
        total.add(launch, price, hours, kwh)


def _week_pieces(begin: float, end: float) -> list[tuple[float, tuple[float, float]]]:
    """[begin, end) in unix seconds cut at each Monday 00:00 UTC, each piece with its week's Monday (unix seconds):
    arithmetic, as a report cuts thousands of launches."""
    pieces: list[tuple[float, tuple[float, float]]] = []
    days = math.floor(begin / DAY_S)
    monday = (days - (days + 3) % 7) * DAY_S  # 1970-01-01, day 0, was a Thursday: weekday 3
    while monday < end:
        after = monday + WEEK_S
        piece = (max(begin, monday), min(end, after))
        if piece[1] > piece[0]:
            pieces.append((monday, piece))
        monday = after
    return pieces


def _weeks(weeks: dict[tuple[float, str], Tally]) -> list[UsageWeek]:
    found = []
    for (monday_s, name), tally in sorted(weeks.items()):
        monday = datetime.fromtimestamp(monday_s, timezone.utc).date()
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


def totals(db: Session, *, now: datetime) -> tuple[Spent, dict[int, Spent]]:
    """Every run's use in all, and each unmeasured run's (the live ones among them), as of `now`: the measured runs'
    stored launches summed in SQL, the others measured."""
    settle(db, now=now)
    with db.begin():
        sums = usage_store.measured_sums(db, ended_before=now - SETTLED)
        total, each = _spent(db, usage_store.unmeasured(db, ended_before=now - SETTLED), now=now)
    gpu, cpu = sums.get("gpu", (0.0, 0.0)), sums.get("cpu", (0.0, 0.0))
    return total.plus(Spent(gpu[0], cpu[0], (gpu[1] + cpu[1]) * cost.JOULES_PER_KWH)), each


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
