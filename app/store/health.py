"""What the health check reads: a run's recent GPU samples, and its last health event."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from app.models import RunEvent
from app.store.metrics import POINTS, SERIES


def gpu_means(
    db: Session, *, run_id: int, fields: Sequence[str], start_step: int, end_step: int
) -> dict[str, float | None]:
    """The mean of each `gpu/<host>/<index>/<field>` series of the run over start_step <= step <= end_step.

    GPU samples are at step = unix seconds, so this is a time window: the step bounds keep the read to those rows
    of the (series, step, rank) index, however long the series. Series without a point there are left out; a mean
    is None when the window holds only NaN.
    """
    keys = or_(*(SERIES.c.key.like(f"gpu/%/{field}") for field in fields))
    query = (
        select(SERIES.c.key, func.avg(POINTS.c.value))
        .join(POINTS, POINTS.c.series_id == SERIES.c.id)
        .where(SERIES.c.run_id == run_id, keys, POINTS.c.step >= start_step, POINTS.c.step <= end_step)
        .group_by(SERIES.c.key)
    )
    return {key: None if mean is None else float(mean) for key, mean in db.execute(query)}


def last_event(db: Session, *, run_id: int, prefixes: Sequence[str], since: datetime | None) -> RunEvent | None:
    """The run's newest event whose reason starts with one of `prefixes`, at or after `since` when given."""
    query = select(RunEvent).where(
        RunEvent.run_id == run_id, or_(*(RunEvent.reason.startswith(prefix, autoescape=True) for prefix in prefixes))
    )
    if since is not None:
        query = query.where(RunEvent.at >= since)
    return db.scalars(query.order_by(RunEvent.id.desc()).limit(1)).first()
