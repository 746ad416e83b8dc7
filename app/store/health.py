"""What the health check reads: a run's recent GPU samples, and its last health event."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timezone

from sqlalchemy import Select, bindparam, or_, select
from sqlalchemy.orm import Session

from app.core.models import RunEvent
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
    import numpy as np  # on first use, not at the server's start (app.store.chunks)

    keys = or_(*(SERIES.c.key.like(f"gpu/%/{field}") for field in fields))
    means: dict[str, float | None] = {}
    for series_id, key in db.execute(select(SERIES.c.id, SERIES.c.key).where(SERIES.c.run_id == run_id, keys)).all():
        values = chunks.read(db, series_id=series_id, first=start_step, last=end_step).values
        if len(values):
            numbers = values[~np.isnan(values)]
            means[key] = float(numbers.mean()) if len(numbers) else None
    return means


EARLIEST = datetime.min.replace(tzinfo=timezone.utc)  # `since` for every event


@functools.cache
def _newest_event(prefixes: tuple[str, ...]) -> Select[RunEvent]:
    """Built once for each set of prefixes (there is one): the supervisor asks for every running run twice a second,
    and building the statement took more than twice as long as running it (bench/supervisor_tick.py)."""
    starts = or_(*(RunEvent.reason.startswith(prefix, autoescape=True) for prefix in prefixes))
    since = RunEvent.at >= bindparam("since")
    query = select(RunEvent).where(RunEvent.run_id == bindparam("run_id"), starts, since)
    return query.order_by(RunEvent.id.desc()).limit(1)


def last_event(db: Session, *, run_id: int, prefixes: Sequence[str], since: datetime | None) -> RunEvent | None:
    """The run's newest event whose reason starts with one of `prefixes`, at or after `since` when given."""
    return db.scalars(_newest_event(tuple(prefixes)), {"run_id": run_id, "since": since or EARLIEST}).first()
