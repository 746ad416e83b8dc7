"""What the communication share reads: each rank's recent per-step timings."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from app.store.metrics import POINTS, SERIES


def recent_means(db: Session, *, run_id: int, keys: Sequence[str], steps: int) -> dict[tuple[str, int], float]:
    """{(key, rank): mean} of each series over its last `steps` steps (from its newest point back)."""
    newest = (
        select(SERIES.c.id.label("series_id"), SERIES.c.key, func.max(POINTS.c.step).label("top"))
        .join(POINTS, POINTS.c.series_id == SERIES.c.id)
        .where(SERIES.c.run_id == run_id, SERIES.c.key.in_(list(keys)))
        .group_by(SERIES.c.id, SERIES.c.key)
        .subquery()
    )
    query = (
        select(newest.c.key, POINTS.c.rank, func.avg(POINTS.c.value))
        .join(POINTS, and_(POINTS.c.series_id == newest.c.series_id, POINTS.c.step > newest.c.top - steps))
        .group_by(newest.c.key, POINTS.c.rank)
    )
    return {(key, rank): float(mean) for key, rank, mean in db.execute(query) if mean is not None}
