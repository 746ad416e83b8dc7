"""What the findings read: the newest points of a few series of a run, by step."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.store import chunks
from app.store.metrics import SERIES


def newest_points(
    db: Session, *, run_id: int, keys: Sequence[str], limit: int
) -> list[tuple[str, int, int, float | None, float]]:
    """(key, step, rank, value, time) of the newest `limit` points of these series together, oldest first; None for
    NaN."""
    series = db.execute(select(SERIES.c.id, SERIES.c.key).where(SERIES.c.run_id == run_id, SERIES.c.key.in_(keys)))
    rows = []
    for series_id, key in series.all():
        points = chunks.newest_points(db, series_id=series_id, limit=limit)
        columns = (points.steps.tolist(), points.ranks.tolist(), points.values.tolist(), points.times.tolist())
        rows += [(key, step, rank, None if value != value else value, time)
                 for step, rank, value, time in zip(*columns, strict=True)]  # fmt: skip
    rows.sort(key=lambda row: row[1])
    return rows[-limit:] if limit else []
