"""What cost and usage read: the runs whose launches may overlap a period, and each run's GPU power and energy
series."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, or_, select, text
from sqlalchemy.orm import Session, load_only

from app.core.models import Run, RunEvent, RunTag
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


def runs_in_period(db: Session, *, start: datetime | None, end: datetime) -> Sequence[Run]:
    """Runs created before `end` that had not ended before `start`, never one being deleted; only the columns cost
    and usage read (a report reads thousands: every column of each took two thirds of its time)."""
    query = select(Run).where(Run.deleting_at.is_(None), Run.created_at < end)
    if start is not None:
        query = query.where(or_(Run.finished_at.is_(None), Run.finished_at >= start))
    return db.scalars(query.options(load_only(*USAGE_COLUMNS)).order_by(Run.id)).all()


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


def settled(db: Session, *, ended_before: datetime) -> Sequence[Run]:
    """Runs that ended before `ended_before` (the columns cost reads); never a run being deleted."""
    query = select(Run).where(Run.deleting_at.is_(None), Run.finished_at.is_not(None), Run.finished_at < ended_before)
    return db.scalars(query.options(load_only(*USAGE_COLUMNS)).order_by(Run.id)).all()


def unsettled(db: Session, *, ended_before: datetime) -> Sequence[Run]:
    """Runs that have not ended, or ended at or after `ended_before` (the columns cost reads); never one being
    deleted."""
    query = select(Run).where(
        Run.deleting_at.is_(None), or_(Run.finished_at.is_(None), Run.finished_at >= ended_before)
    )
    return db.scalars(query.options(load_only(*USAGE_COLUMNS)).order_by(Run.id)).all()


def settled_mark(db: Session, *, ended_before: datetime) -> tuple[int, int | None, datetime | None]:
    """How many runs ended before `ended_before`, the highest id and the latest end among them: what changes when one
    more ends, one is resumed or one goes away."""
    query = select(func.count(), func.max(Run.id), func.max(Run.finished_at)).where(
        Run.deleting_at.is_(None), Run.finished_at.is_not(None), Run.finished_at < ended_before
    )
    count, highest, latest = db.execute(query).one()
    return int(count), highest, latest
