"""What cost and usage read: the runs whose launches may overlap a period, each run's GPU power and energy series, and
the stored launches of the runs already measured (run_costs)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Row, Text, and_, cast, delete, func, not_, or_, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased, load_only

from app.core.models import FINAL_STATUSES, LaunchCost, Run, RunEvent, RunTag
from app.store import chunks
from app.store.metrics import SERIES

ENERGY_FIELDS = ("power", "energy")  # W sampled, and NVML's total-energy counter in J where the GPU has one
BATCH = 10_000  # run ids in one IN list: SQLite allows 32,766 parameters
Gpu = tuple[str, str]  # (host, index)
# What cost, goodput and usage read of a run (app.services.cost, goodput.compute, the launchers' `ranks`).
USAGE_COLUMNS = (
    Run.id, Run.status, Run.created_at, Run.finished_at, Run.launcher, Run.owner, Run.created_by, Run.world_size,
    Run.nproc_per_node, Run.slurm_nodes, Run.slurm_gpus_per_node, Run.gpus, Run.script, Run.restarts,
)  # fmt: skip


def events_of(db: Session, *, run_ids: Sequence[int]) -> dict[int, list[RunEvent]]:
    """Each run's lifecycle events, oldest first, in one query per 10,000 runs."""
    found: dict[int, list[RunEvent]] = defaultdict(list)
    for part in range(0, len(run_ids), BATCH):
        chosen = list(run_ids[part : part + BATCH])
        query = select(RunEvent).where(RunEvent.run_id.in_(chosen)).order_by(RunEvent.id)
        for event in db.scalars(
            query.options(load_only(RunEvent.run_id, RunEvent.at, RunEvent.status, RunEvent.reason))
        ):
            found[event.run_id].append(event)
    return found


def tags_of(db: Session, *, run_ids: Sequence[int]) -> dict[int, list[str]]:
    """Each run's tags, in order."""
    found: dict[int, list[str]] = defaultdict(list)
    for part in range(0, len(run_ids), BATCH):
        chosen = list(run_ids[part : part + BATCH])
        for run_id, tag in db.execute(
            select(RunTag.run_id, RunTag.tag).where(RunTag.run_id.in_(chosen)).order_by(RunTag.tag)
        ):
            found[run_id].append(tag)
    return found


def energy_series(db: Session, *, run_ids: Sequence[int]) -> dict[int, dict[Gpu, dict[str, int]]]:
    """Per run, per GPU (host, index): the series id of each of its `gpu/<host>/<index>/power|energy` series."""
    found: dict[int, dict[Gpu, dict[str, int]]] = defaultdict(dict)
    keys = or_(*(SERIES.c.key.like(f"gpu/%/{field}") for field in ENERGY_FIELDS))
    for part in range(0, len(run_ids), BATCH):
        chosen = list(run_ids[part : part + BATCH])
        rows = db.execute(select(SERIES.c.run_id, SERIES.c.key, SERIES.c.id).where(SERIES.c.run_id.in_(chosen), keys))
        for run_id, key, series_id in rows:
            pieces = key.split("/")
            if len(pieces) == 4 and pieces[3] in ENERGY_FIELDS:  # a host holds no "/" (wire.MAX_HOST_LENGTH's keys)
                found[run_id].setdefault((pieces[1], pieces[2]), {})[pieces[3]] = series_id
    return dict(found)


def runs_with_series(db: Session, *, run_ids: Sequence[int], prefix: str) -> set[int]:
    """Those of the runs that have a series whose key starts with `prefix`."""
    found: set[int] = set()
    for part in range(0, len(run_ids), BATCH):
        chosen = list(run_ids[part : part + BATCH])
        query = select(SERIES.c.run_id).where(
            SERIES.c.run_id.in_(chosen), SERIES.c.key.startswith(prefix, autoescape=True)
        )
        found |= set(db.scalars(query.distinct()))
    return found


def readings_at_ends(db: Session, *, series_id: int, first: int, last: int) -> chunks.Points:
    """The series' points in the lowest and the highest of its chunks holding steps in [first, last], within it: where
    a counter's first and last readings there are, without reading the chunks between."""
    span = "FROM metric_chunks WHERE series_id = :series_id AND chunk BETWEEN :low AND :high"
    bounds = {"series_id": series_id, "low": first // chunks.SPAN, "high": last // chunks.SPAN}
    # Two statements: SQLite answers a lone MIN or MAX with one seek, but MIN and MAX together with a scan.
    low, high = (db.scalar(text(f"SELECT {end}(chunk) {span}"), bounds) for end in ("MIN", "MAX"))
    if low is None or high is None:
        return chunks.Points.empty()
    ends = [(max(first, low * chunks.SPAN), min(last, (low + 1) * chunks.SPAN - 1))]
    if high != low:
        ends.append((max(first, high * chunks.SPAN), min(last, (high + 1) * chunks.SPAN - 1)))
    return chunks.Points.joined([chunks.read(db, series_id=series_id, first=a, last=b) for a, b in ends])


def measured(*, ended_before: datetime) -> ColumnElement[bool]:
    """A run that ended before `ended_before` and has its launches in run_costs, measured since it last ended."""
    stored = aliased(LaunchCost)  # apart from run_costs in a query that reads it too
    rows = select(stored.run_id).where(stored.run_id == Run.id, stored.run_ended_at == Run.finished_at)
    # finished_at's test first: with it NULL the whole is false, never NULL, so that not_() of it holds.
    return and_(Run.finished_at.is_not(None), Run.finished_at < ended_before, Run.status.in_(FINAL_STATUSES),
                rows.exists())  # fmt: skip


def _period(query: Any, *, start: datetime | None, end: datetime) -> Any:
    """Runs created before `end` that had not ended before `start`, never one being deleted."""
    query = query.where(Run.deleting_at.is_(None), Run.created_at < end)
    return query if start is None else query.where(or_(Run.finished_at.is_(None), Run.finished_at >= start))


def measured_launches(db: Session, *, start: datetime | None, end: datetime, ended_before: datetime) -> list[Row[Any]]:
    """The stored launches of the measured runs of the period that overlap it, with who and what launched them, in
    one query (a run that never launched has none); their GPU models as JSON text, which a report prices once for
    each distinct text."""
    query = select(LaunchCost.run_id, LaunchCost.launched, LaunchCost.ended, LaunchCost.device,
                   LaunchCost.device_hours, LaunchCost.kwh, cast(LaunchCost.gpu_models, Text).label("gpu_models"),
                   LaunchCost.goodput, Run.owner,
                   Run.created_by, Run.launcher).join(Run, Run.id == LaunchCost.run_id)  # fmt: skip
    query = _period(query, start=start, end=end).where(  # measured(), said of the row at hand
        Run.finished_at < ended_before, Run.status.in_(FINAL_STATUSES), LaunchCost.run_ended_at == Run.finished_at
    )
    query = query.where(LaunchCost.launched < end.timestamp())
    if start is not None:
        query = query.where(LaunchCost.ended > start.timestamp())
    return list(db.execute(query.order_by(LaunchCost.run_id, LaunchCost.attempt)))


def unmeasured_in_period(
    db: Session, *, start: datetime | None, end: datetime, ended_before: datetime
) -> Sequence[Run]:
    """The runs of the period whose launches are not stored (live, ended lately, or not measured yet); only the
    columns cost and usage read (a report reads thousands: every column of each took two thirds of its time)."""
    query = _period(select(Run), start=start, end=end).where(not_(measured(ended_before=ended_before)))
    return db.scalars(query.options(load_only(*USAGE_COLUMNS)).order_by(Run.id)).all()


def unmeasured(db: Session, *, ended_before: datetime) -> Sequence[Run]:
    """Every run whose launches are not stored (the columns cost reads); never one being deleted."""
    query = select(Run).where(Run.deleting_at.is_(None), not_(measured(ended_before=ended_before)))
    return db.scalars(query.options(load_only(*USAGE_COLUMNS)).order_by(Run.id)).all()


def to_measure(db: Session, *, ended_before: datetime, after_id: int, limit: int) -> Sequence[Run]:
    """Up to `limit` runs past `after_id` that ended before `ended_before` and whose launches are not stored since
    (never measured, or resumed and ended again), by id; never one being deleted."""
    query = select(Run).where(
        Run.deleting_at.is_(None), Run.id > after_id, Run.finished_at.is_not(None), Run.finished_at < ended_before,
        Run.status.in_(FINAL_STATUSES), not_(measured(ended_before=ended_before)),
    )  # fmt: skip
    return db.scalars(query.options(load_only(*USAGE_COLUMNS)).order_by(Run.id).limit(limit)).all()


def store_launches(db: Session, *, run_ids: Sequence[int], rows: Sequence[dict[str, Any]]) -> None:
    """Replaces these runs' stored launches with `rows`; rows another server process stored meanwhile (the same
    measures) are left as they are."""
    db.execute(delete(LaunchCost).where(LaunchCost.run_id.in_(run_ids)))
    if rows:
        db.execute(_insert_or_skip(db), rows)


def _insert_or_skip(db: Session) -> Any:
    dialect = postgresql if db.get_bind().dialect.name == "postgresql" else sqlite
    table = LaunchCost.__table__
    return dialect.insert(table).on_conflict_do_nothing(index_elements=[table.c.run_id, table.c.attempt])


def measured_sums(db: Session, *, ended_before: datetime) -> dict[str, tuple[float, float]]:
    """Per device (gpu, cpu), the device-hours and kWh of every measured run's stored launches."""
    query = select(LaunchCost.device, func.sum(LaunchCost.device_hours), func.coalesce(func.sum(LaunchCost.kwh), 0.0))
    query = query.join(Run, Run.id == LaunchCost.run_id).where(
        Run.deleting_at.is_(None), measured(ended_before=ended_before)
    )
    return {device: (hours or 0.0, kwh or 0.0) for device, hours, kwh in db.execute(query.group_by(LaunchCost.device))}
