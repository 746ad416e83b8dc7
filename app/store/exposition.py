"""What /metrics reads: runs counted by status, and the newest GPU sample of each GPU series of some runs."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from app.models import Run, RunStatus
from app.store.metrics import POINTS, SERIES


def runs_by_status(db: Session) -> dict[RunStatus, int]:
    return {status: count for status, count in db.execute(select(Run.status, func.count()).group_by(Run.status))}


def live_runs(db: Session, *, statuses: Sequence[RunStatus], limit: int) -> Sequence[Run]:
    """Runs in these states, newest first, at most `limit`."""
    return db.scalars(select(Run).where(Run.status.in_(list(statuses))).order_by(Run.id.desc()).limit(limit)).all()


def latest_gpu_samples(
    db: Session, *, run_ids: Sequence[int], fields: Sequence[str], limit: int
) -> list[tuple[int, str, float | None]]:
    """(run_id, key, value) of the newest point of each `gpu/<host>/<index>/<field>` series of the runs.

    The newest is the highest step (GPU samples are at step = unix seconds): MAX over the series' own range of the
    (series, step, rank) index, one lookup per series however long it is.
    """
    if not run_ids:
        return []
    inner = POINTS.alias("newest_points")
    newest = select(func.max(inner.c.step)).where(inner.c.series_id == SERIES.c.id).scalar_subquery()
    keys = or_(*(SERIES.c.key.like(f"gpu/%/{field}") for field in fields))
    query = (
        select(SERIES.c.run_id, SERIES.c.key, func.max(POINTS.c.value))  # one value if ranks share the step
        .join(POINTS, POINTS.c.series_id == SERIES.c.id)
        .where(SERIES.c.run_id.in_(list(run_ids)), keys, POINTS.c.step == newest)
        .group_by(SERIES.c.run_id, SERIES.c.key)
        .order_by(SERIES.c.run_id.desc(), SERIES.c.key)
        .limit(limit)
    )
    return [(run_id, key, value) for run_id, key, value in db.execute(query)]
