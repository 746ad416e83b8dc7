"""What the health check reads: a run's recent GPU samples, and its last health event."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.models import RunEvent
from app.store import chunks
from app.store.metrics import SERIES


def gpu_means(
    db: Session, *, run_id: int, fields: Sequence[str], start_step: int, end_step: int
) -> dict[str, float | None]:
    """The mean of each `gpu/<host>/<index>/<field>` series of the run over start_step <= step <= end_step.

    GPU samples are at step = unix seconds, so this is a time window: the step bounds keep the read to the chunks
    that hold it, however long the series. Series without a point there are left out; a mean is None when the window
    holds only NaN.
    """
    keys = or_(*(SERIES.c.key.like(f"gpu/%/{field}") for field in fields))
    means: dict[str, float | None] = {}
    for series_id, key in db.execute(select(SERIES.c.id, SERIES.c.key).where(SERIES.c.run_id == run_id, keys)).all():
        values = chunks.read(db, series_id=series_id, first=start_step, last=end_step).values
        if len(values):
            numbers = values[~np.isnan(values)]
            means[key] = float(numbers.mean()) if len(numbers) else None
    return means


def last_event(db: Session, *, run_id: int, prefixes: Sequence[str], since: datetime | None) -> RunEvent | None:
    """The run's newest event whose reason starts with one of `prefixes`, at or after `since` when given."""
    query = select(RunEvent).where(
        RunEvent.run_id == run_id, or_(*(RunEvent.reason.startswith(prefix, autoescape=True) for prefix in prefixes))
    )
    if since is not None:
        query = query.where(RunEvent.at >= since)
    return db.scalars(query.order_by(RunEvent.id.desc()).limit(1)).first()
