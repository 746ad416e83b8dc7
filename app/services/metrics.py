"""Metrics: take a trainer's batch (idempotently), and read series back."""

from __future__ import annotations

import hmac
import math

from sqlalchemy.orm import Session

from app.errors import InvalidToken, RunNotActive
from app.models import RunStatus, utcnow
from app.schemas import BatchIn, IngestResult, PointOut, SeriesOut
from app.services.runs import get_run, hash_token
from app.store import metrics as metric_store
from app.store import runs as run_store
from app.store.metrics import StoredPoint

ACCEPTS_METRICS = (RunStatus.starting, RunStatus.running, RunStatus.stopping)


def ingest(db: Session, *, run_id: int, token: str, batch: BatchIn) -> IngestResult:
    """Stores a batch in one transaction; points already stored (a retry, a replayed spool) are skipped."""
    with db.begin():
        run = get_run(db, run_id=run_id)
        if run.token_hash is None or not hmac.compare_digest(run.token_hash, hash_token(token)):
            raise InvalidToken(f"the token is not the one run {run_id} was launched with")
        if run.status not in ACCEPTS_METRICS:
            raise RunNotActive(f"run {run_id} is {run.status.value}: it takes no more metrics")
        ids = metric_store.series_ids(db, run_id=run_id, keys={p.key for p in batch.points})
        rows = [(ids[p.key], p.step, p.rank, None if math.isnan(p.value) else p.value, p.time) for p in batch.points]
        stored = metric_store.insert_points(db, rows)
        if batch.progress is not None:
            progress = batch.progress
            run.epoch, run.step, run.total_steps = progress.epoch, progress.step, progress.total_steps
            run.samples_per_s = progress.samples_per_s
            run.heartbeat_at = utcnow()
            if run.status == RunStatus.starting:
                run_store.set_status(db, run, RunStatus.running, "the trainer reported its first progress")
    return IngestResult(accepted=len(rows), stored=stored)


def read_series(db: Session, *, run_id: int, key: str, start_step: int, end_step: int | None, limit: int) -> SeriesOut:
    """A page of one series by step; `next_step` continues it."""
    get_run(db, run_id=run_id)
    points = metric_store.points_in_range(
        db, run_id=run_id, key=key, start_step=start_step, end_step=end_step, limit=limit + 1
    )
    next_step = points[limit].step if len(points) > limit else None
    # A page never splits one step's ranks: drop the partial last step and start the next page there.
    page = [p for p in points[:limit] if next_step is None or p.step < next_step] or points[:limit]
    return SeriesOut(key=key, points=[_out(p) for p in page], next_step=next_step)


def _out(point: StoredPoint) -> PointOut:
    return PointOut(step=point.step, rank=point.rank, value=point.value, time=point.time)


def series_keys(db: Session, *, run_id: int) -> list[str]:
    get_run(db, run_id=run_id)
    return metric_store.series_keys(db, run_id=run_id)


def new_points(db: Session, *, run_id: int, after_id: int, limit: int = 5000) -> list[StoredPoint]:
    """Points stored since the cursor `after_id`: what a live page has not seen yet."""
    return metric_store.points_after(db, run_id=run_id, after_id=after_id, limit=limit)
