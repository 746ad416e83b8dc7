"""What goodput reads: each rank's latest ledger report, and the runs a summary covers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from app.models import Run
from app.store.metrics import POINTS, SERIES

LEDGER_PREFIX = "goodput/"


def latest_ledger_values(db: Session, *, run_id: int) -> list[tuple[str, int, float | None]]:
    """(key, rank, value) of the newest report of every `goodput/...` series of the run, per rank.

    A ledger's report number is the point's step and each report's totals replace the one before, so the newest is
    the one at the highest step: one grouped read over the (series, step, rank) index.
    """
    # The run's ledger series first, then their points by series id: joined in one statement, PostgreSQL cannot
    # tell how few series the prefix picks and read the point table at large (400 ms a run page in a 1e8-point store).
    ledger = select(SERIES.c.id, SERIES.c.key).where(
        SERIES.c.run_id == run_id, SERIES.c.key.startswith(LEDGER_PREFIX, autoescape=True)
    )
    keys: dict[int, str] = {series_id: key for series_id, key in db.execute(ledger)}
    if not keys:
        return []
    in_ledger = POINTS.c.series_id.in_(keys)
    newest = (
        select(POINTS.c.series_id, POINTS.c.rank, func.max(POINTS.c.step).label("step"))
        .where(in_ledger)
        .group_by(POINTS.c.series_id, POINTS.c.rank)
        .subquery()
    )
    at_newest = and_(
        newest.c.series_id == POINTS.c.series_id, newest.c.rank == POINTS.c.rank, newest.c.step == POINTS.c.step
    )
    query = select(POINTS.c.series_id, POINTS.c.rank, POINTS.c.value).join(newest, at_newest).where(in_ledger)
    return [(keys[series_id], rank, value) for series_id, rank, value in db.execute(query)]


def highest_step_before(db: Session, *, run_id: int, key: str, before: float) -> int:
    """The highest step of the run's `key` series logged before the unix time `before` (0 if none)."""
    query = (
        select(func.max(POINTS.c.step))
        .join(SERIES, SERIES.c.id == POINTS.c.series_id)
        .where(SERIES.c.run_id == run_id, SERIES.c.key == key, POINTS.c.time < before)
    )
    return int(db.scalar(query) or 0)


def runs_for_summary(db: Session, *, since: datetime | None, name_prefix: str, limit: int) -> Sequence[Run]:
    """Runs created at or after `since` whose name starts with `name_prefix`, newest first, at most `limit`."""
    query = select(Run)
    if since is not None:
        query = query.where(Run.created_at >= since)
    if name_prefix:
        query = query.where(Run.name.startswith(name_prefix, autoescape=True))
    return db.scalars(query.order_by(Run.id.desc()).limit(limit)).all()
