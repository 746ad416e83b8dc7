"""What the findings read: the newest points of a few series of a run, by step."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.store.metrics import POINTS, SERIES


def newest_points(
    db: Session, *, run_id: int, keys: Sequence[str], limit: int
) -> list[tuple[str, int, int, float | None, float]]:
    """(key, step, rank, value, time) of the newest `limit` points of these series together, oldest first."""
    query = (
        select(SERIES.c.key, POINTS.c.step, POINTS.c.rank, POINTS.c.value, POINTS.c.time)
        .join(POINTS, POINTS.c.series_id == SERIES.c.id)
        .where(SERIES.c.run_id == run_id, SERIES.c.key.in_(keys))
        .order_by(POINTS.c.step.desc())
        .limit(limit)
    )
    rows = [(key, step, rank, value, time) for key, step, rank, value, time in db.execute(query)]
    return rows[::-1]
