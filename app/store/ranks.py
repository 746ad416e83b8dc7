"""Per-rank heartbeats: one row per (run, rank), replaced by each newer heartbeat."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import Insert, Table, bindparam, case, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.core.models import RunRank

RANKS: Table = RunRank.__table__  # type: ignore[assignment]


def upsert_heartbeats(db: Session, beats: Mapping[tuple[int, int], tuple[str, int]], *, at: datetime) -> None:
    """Records that each (run, rank): (host, step) was there at `at`, replacing what each said before: one
    executemany upsert, whatever the number of ranks and runs (an ingest group's posts bring them all). One row per
    (run, rank), as a mapping has: PostgreSQL refuses a statement that would update one row twice."""
    rows = [{"run_id": run_id, "rank": rank, "host": host, "step": step, "heartbeat_at": at}
            for (run_id, rank), (host, step) in beats.items()]  # fmt: skip
    if rows:
        db.execute(_upsert(db.get_bind().dialect.name), rows)


@functools.cache
def _upsert(dialect_name: str) -> Insert:
    """The heartbeats' upsert, built once per dialect: building it took longer than running it (bench/big_job.py)."""
    statement = (postgresql if dialect_name == "postgresql" else sqlite).insert(RANKS)
    new = statement.excluded
    return statement.on_conflict_do_update(
        index_elements=["run_id", "rank"], set_={"host": new.host, "step": new.step, "heartbeat_at": new.heartbeat_at}
    )


# Built once: the supervisor reads each running run's ranks twice a second (bench/supervisor_tick.py).
_RANK_ROWS = select(RunRank).where(RunRank.run_id == bindparam("run_id")).order_by(RunRank.rank)


def silent_count(db: Session, *, run_id: int, before: datetime) -> tuple[int, int]:
    """How many ranks the run has, and how many of them last sent a heartbeat before `before`: one aggregate."""
    silent = func.coalesce(func.sum(case((RunRank.heartbeat_at < before, 1), else_=0)), 0)
    ranks, quiet = db.execute(select(func.count(), silent).where(RunRank.run_id == run_id)).one()
    return int(ranks), int(quiet)


def rank_rows(db: Session, *, run_id: int) -> list[RunRank]:
    """The run's ranks by number, with their last heartbeat."""
    return list(db.scalars(_RANK_ROWS, {"run_id": run_id}))


def set_ending(db: Session, *, run_id: int, rank: int, host: str, how: str, at: datetime) -> None:
    """Records how `rank`'s process ended (wire.ENDINGS); a rank that never sent a heartbeat gets its row here."""
    dialect = postgresql if db.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(RANKS).values(run_id=run_id, rank=rank, host=host, step=0, heartbeat_at=at, ended=how)
    db.execute(statement.on_conflict_do_update(index_elements=["run_id", "rank"], set_={"ended": how}))


def endings(db: Session, *, run_id: int) -> dict[int, str]:
    """How each rank of the run that has ended did so, by rank."""
    rows = db.execute(select(RunRank.rank, RunRank.ended).where(RunRank.run_id == run_id, RunRank.ended.is_not(None)))
    return {rank: str(ended) for rank, ended in rows}


def clear_endings(db: Session, *, run_id: int) -> None:
    """Forgets how the ranks' processes ended: the job was started again."""
    db.execute(update(RunRank).where(RunRank.run_id == run_id).values(ended=None))
