"""What the GPU health checks read: a run's GPU health series that show trouble, and their points."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import Table, or_, select
from sqlalchemy.orm import Session

from app.core.models import MetricSummary
from app.store import chunks

SUMMARIES: Table = MetricSummary.__table__  # type: ignore[assignment]


class HealthSeries(NamedTuple):
    series_id: int
    key: str  # gpu/<host>/<index>/<field>
    low: float | None  # the series' min and max over all its points, as its summary keeps them
    high: float | None


def suspect_series(db: Session, *, run_ids: Sequence[int], fields: Sequence[str], above: float) -> list[HealthSeries]:
    """The runs' `gpu/<host>/<index>/<field>` series whose highest value is above `above`, or which moved: read
    from the series' summaries (one indexed query), so a healthy run costs no point reads."""
    if not run_ids:
        return []
    keys = or_(*(SUMMARIES.c.key.like(f"gpu/%/{field}") for field in fields))
    moved = or_(SUMMARIES.c.max_value > above, SUMMARIES.c.max_value > SUMMARIES.c.min_value)
    query = select(SUMMARIES.c.series_id, SUMMARIES.c.key, SUMMARIES.c.min_value, SUMMARIES.c.max_value).where(
        SUMMARIES.c.run_id.in_(list(run_ids)), keys, moved
    )
    return [HealthSeries(*row) for row in db.execute(query)]


def newest(db: Session, *, series_id: int, limit: int) -> list[tuple[int, float]]:
    """(step, value) of the series' newest `limit` points, oldest first; NaN (stored as NULL) left out."""
    points = chunks.newest_points(db, series_id=series_id, limit=limit)
    return [(int(step), float(value)) for step, value in zip(points.steps, points.values, strict=True)
            if value == value]  # fmt: skip
