"""What goodput reads: each rank's latest ledger report, and the runs a summary covers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.models import Run
from app.store import chunks
from app.store.metrics import SERIES

LEDGER_PREFIX = "goodput/"


def latest_ledger_values(db: Session, *, run_id: int) -> list[tuple[str, int, float | None]]:
    """(key, rank, value) of the newest report of every `goodput/...` series of the run, per rank; None for NaN.

    A ledger's report number is the point's step and each report's totals replace the one before, so the newest is
    the one at the highest step: in each rank's highest chunk.
    """
    ledger = select(SERIES.c.id, SERIES.c.key).where(
        SERIES.c.run_id == run_id, SERIES.c.key.startswith(LEDGER_PREFIX, autoescape=True)
    )
    found = []
    for series_id, key in db.execute(ledger).all():
        newest = chunks.newest_of_each_rank(db, series_id=series_id)  # by step: a rank's last is its newest
        last = {rank: value for rank, value in zip(newest.ranks.tolist(), newest.values.tolist(), strict=True)}
        found += [(key, rank, None if math.isnan(value) else value) for rank, value in sorted(last.items())]
    return found


def highest_step_before(db: Session, *, run_id: int, key: str, before: float) -> int:
    """The highest step of the run's `key` series logged before the unix time `before` (0 if none)."""
    series_id = db.scalar(select(SERIES.c.id).where(SERIES.c.run_id == run_id, SERIES.c.key == key))
    points = (
        chunks.Points.empty() if series_id is None else chunks.newest_before(db, series_id=series_id, before=before)
    )
    return int(points.steps.max()) if len(points) else 0


def runs_for_summary(db: Session, *, since: datetime | None, name_prefix: str, limit: int) -> Sequence[Run]:
    """Runs created at or after `since` whose name starts with `name_prefix`, newest first, at most `limit`."""
    query = select(Run)
    if since is not None:
        query = query.where(Run.created_at >= since)
    if name_prefix:
        query = query.where(Run.name.startswith(name_prefix, autoescape=True))
    return db.scalars(query.order_by(Run.id.desc()).limit(limit)).all()
