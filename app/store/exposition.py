"""What /metrics reads: runs counted by status, and the newest GPU sample of each GPU series of some runs."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Table, func, or_, select
from sqlalchemy.orm import Session

from app.core.models import MetricSummary, Run, RunStatus

SUMMARIES: Table = MetricSummary.__table__  # type: ignore[assignment]


def runs_by_status(db: Session) -> dict[RunStatus, int]:
    return {status: count for status, count in db.execute(select(Run.status, func.count()).group_by(Run.status))}


def live_runs(db: Session, *, statuses: Sequence[RunStatus], limit: int) -> Sequence[Run]:
    """Runs in these states, newest first, at most `limit`."""
    return db.scalars(select(Run).where(Run.status.in_(list(statuses))).order_by(Run.id.desc()).limit(limit)).all()


def latest_gpu_samples(
    db: Session, *, run_ids: Sequence[int], fields: Sequence[str], limit: int
) -> list[tuple[int, str, float | None]]:
    """(run_id, key, value) of the newest point of each `gpu/<host>/<index>/<field>` series of the runs.

    The newest is the highest step (GPU samples are at step = unix seconds), as the series' summary keeps it (the
    lowest rank's, where ranks share the step: one node's sampler reports each GPU).
    """
    if not run_ids:
        return []
    keys = or_(*(SUMMARIES.c.key.like(f"gpu/%/{field}") for field in fields))
    query = (
        select(SUMMARIES.c.run_id, SUMMARIES.c.key, SUMMARIES.c.last_value)
        .where(SUMMARIES.c.run_id.in_(list(run_ids)), keys)
        .order_by(SUMMARIES.c.run_id.desc(), SUMMARIES.c.key)
        .limit(limit)
    )
    return [(run_id, key, value) for run_id, key, value in db.execute(query)]
