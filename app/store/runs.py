"""Runs: reading them, and holding one's row (its status is written by app.services.lifecycle.transitions)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import and_, bindparam, or_, select, update
from sqlalchemy.orm import Session, defer

from app.core.models import Alert, Run, RunStatus, RunToken


def get_run(db: Session, run_id: int) -> Run | None:
    return db.get(Run, run_id)


def reread_locked(db: Session, run: Run, attribute: str | None = None) -> None:
    """Rereads one column of the run (all of them by default) with its row held for writing until the commit, so
    that what the caller decides from it (a read-modify-write, a launch, a stop) loses no concurrent change. A write,
    not SELECT FOR UPDATE: SQLite has no row locks, and its deferred transaction takes the write lock only at the
    first write, after a plain read could already be stale. What this session changed is written first: the reread
    would drop it (ingest changes a group's runs without autoflush, app.services.metrics)."""
    db.flush()
    column = attribute or "id"
    db.execute(update(Run).where(Run.id == run.id).values({column: getattr(Run, column)}))
    db.refresh(run, attribute_names=[attribute] if attribute else None)


def status_of(db: Session, run_id: int) -> RunStatus | None:
    """The run's status alone; None where there is no such run."""
    return db.scalar(select(Run.status).where(Run.id == run_id))


def run_by_external_key(db: Session, key: str) -> Run | None:
    """The run launched elsewhere whose processes join by `key`."""
    return db.scalar(select(Run).where(Run.external_key == key))


def has_process_token(db: Session, *, run_id: int, token_hash: str) -> bool:
    """Whether one of the run's joined processes was given the token of this hash."""
    return db.scalar(select(RunToken.run_id).where(RunToken.token_hash == token_hash)) == run_id


def recent_runs(db: Session, *, workload: str, limit: int) -> Sequence[Run]:
    """The newest runs of a workload."""
    return db.scalars(select(Run).where(Run.workload == workload).order_by(Run.id.desc()).limit(limit)).all()


def runs_with_status(db: Session, statuses: Iterable[RunStatus]) -> Sequence[Run]:
    """Runs in any of `statuses`, oldest first (the order a queue is served in)."""
    return db.scalars(select(Run).where(Run.status.in_(list(statuses))).order_by(Run.id)).all()


# The supervisor's statement, built once: the values change from tick to tick, the statement does not, and building
# it anew at each of two ticks a second was three quarters of its cost (bench/supervisor_tick.py).
_QUEUED = Run.status == RunStatus.queued
_ALERTED = select(Alert.run_id).where(Alert.cleared_at.is_(None), Alert.run_id.is_not(None))
_TO_SUPERVISE = (
    select(Run)
    .where(
        or_(
            Run.status.in_(bindparam("active", expanding=True)),
            and_(
                _QUEUED,
                or_(Run.launcher.not_in(bindparam("host", expanding=True)), Run.job_id.is_not(None),
                    Run.id.in_(_ALERTED)),
            ),
        )
    )
    .order_by(Run.id)
    # Not the nodes' GPU inventory, which grows with the job (128 nodes' JSON decoded twice a second): what reads it
    # (a GPU fault's alert) loads it then.
    .options(defer(Run.gpus))
)  # fmt: skip


def runs_to_supervise(db: Session, *, active: Iterable[RunStatus], host: Sequence[str]) -> list[Run]:
    """The runs in `active` statuses, and of the queued runs those a supervisor's tick may act on, oldest first:
    those not launched by the `host` launchers (Slurm's, whose job waits in Slurm's queue or is still to be
    submitted), and those with an alert still open (a resumed run clears it).

    This host's queue is not read as objects: loading it at every tick took ~0.05 ms a run, 11% of a core for 1,000
    queued runs, from training on the same node (bench/supervisor_tick.py). The queue's decision reads it as rows
    (app.store.queue.waiting), and loads only the runs it starts."""
    return list(db.scalars(_TO_SUPERVISE, {"active": list(active), "host": list(host)}))
