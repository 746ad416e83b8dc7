"""Deleting a run: its rows and metric points in short batches, each its own transaction, so that ingest into other
runs never waits long for the write lock; and, when asked, its own log and checkpoint folders, nothing else."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence

from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session

from app.core.errors import RunNotActive, RunNotFound
from app.core.folders import RunFolders
from app.core.models import MetricSeries, Run, utcnow
from app.schemas.runs_table import RunDeletionOut, RunFolderOut
from app.services import runs
from app.store import audit, chunks

# Rows per transaction: a few ms of SQLite's write lock on a small machine (bench/runs_table.py measures it); a
# chunk row (up to chunks.SPAN points) counts as 16.
BATCH = 2_000
# After each batch the deletion waits at least this long, or as long as the batch took if longer: a writer that
# found the lock taken sleeps in SQLite's busy handler (1, 2, 5, 10, 15, 20 ms...), and a deletion that took the lock
# straight back would find it asleep every time and starve it (an ingest waited 730 ms behind 1,000,000 points).
PAUSE_S = 0.03
_CHUNKS = text(
    "DELETE FROM metric_chunks WHERE series_id = :series_id AND chunk <= (SELECT MAX(chunk) FROM"
    " (SELECT chunk FROM metric_chunks WHERE series_id = :series_id ORDER BY chunk LIMIT :n) f)"
)
_TIERS = text(
    "DELETE FROM metric_tiers WHERE series_id = :series_id AND tier = :tier AND bucket <= (SELECT MAX(bucket) FROM"
    " (SELECT bucket FROM metric_tiers WHERE series_id = :series_id AND tier = :tier ORDER BY bucket LIMIT :n) f)"
)


def plan(db: Session, *, run_id: int, folders: RunFolders, files: bool) -> RunDeletionOut:
    """What deleting the run would remove (its folders only with `files`), without removing anything."""
    with db.begin():
        run = runs.get_run(db, run_id=run_id)
        series = db.scalars(select(MetricSeries.id).where(MetricSeries.run_id == run_id)).all()
        points = chunks.count(db, series_ids=series)
        own = _own_folders(run, folders) if files else []
        return RunDeletionOut(run_id=run.id, name=run.name, points=points, folders=own,
                              bytes=sum(folder.bytes for folder in own), deleted=False)  # fmt: skip


def _own_folders(run: Run, folders: RunFolders) -> list[RunFolderOut]:
    """The run's log and checkpoint folders that exist, and are real folders inside the shared root's own places."""
    found = []
    for path, parent in ((folders.run_dir(run), "logs"), (folders.checkpoint_dir(run), "checkpoints")):
        if path.is_dir() and not path.is_symlink() and path.resolve().parent == (folders.shared / parent).resolve():
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
            found.append(RunFolderOut(path=str(path.relative_to(folders.shared)), bytes=size))
    return found


def delete_run(
    db: Session, *, run_id: int, folders: RunFolders, files: bool, actor: str, batch: int = BATCH
) -> RunDeletionOut:
    """Deletes a finished run: marks it (it leaves every list at once), then its points and tiers batch by batch,
    then its rows; then its folders if `files`. A run still queued or live is refused: stop it first."""
    deletion = plan(db, run_id=run_id, folders=folders, files=files)
    with db.begin():
        run = runs.get_run(db, run_id=run_id)
        if not run.status.is_final:
            raise RunNotActive(f"run {run_id} is {run.status.value}: stop it before deleting it")
        run.deleting_at = run.deleting_at or utcnow()
        series = list(db.scalars(select(MetricSeries.id).where(MetricSeries.run_id == run_id)))
    for series_id in series:
        _delete_batched(db, _CHUNKS, {"series_id": series_id, "n": max(1, batch // 16)})
        for tier in _tiers_of(db, series_id):
            _delete_batched(db, _TIERS, {"series_id": series_id, "tier": tier, "n": batch})
    with db.begin():  # what is left is a few rows per series, and the run's own: cascades take them
        db.execute(delete(Run).where(Run.id == run_id))
        what = f"run {run_id} {deletion.name!r}: {deletion.points} points" + (", and its folders" if files else "")
        audit.record(db, actor=actor, action="deleted run", detail=what)
    for folder in deletion.folders:  # only with `files`: checked to be the run's own when planned
        shutil.rmtree(folders.shared / folder.path, ignore_errors=True)
    return deletion.model_copy(update={"deleted": True})


def delete_runs(
    db: Session, *, run_ids: Sequence[int], folders: RunFolders, actor: str
) -> tuple[list[int], dict[int, str]]:
    """Deletes each finished run of these (their folders stay); returns those deleted, and why the others were not."""
    done, refused = [], {}
    for run_id in dict.fromkeys(run_ids):
        try:
            delete_run(db, run_id=run_id, folders=folders, files=False, actor=actor)
            done.append(run_id)
        except (RunNotActive, RunNotFound) as error:
            refused[run_id] = error.message
    return done, refused


def _tiers_of(db: Session, series_id: int) -> list[int]:
    with db.begin():
        return list(db.scalars(text("SELECT DISTINCT tier FROM metric_tiers WHERE series_id = :s"), {"s": series_id}))


def _delete_batched(db: Session, statement: object, params: dict[str, int]) -> None:
    """Runs a DELETE ... LIMIT in one short transaction after another until it deletes fewer than a batch."""
    while True:
        started = time.monotonic()
        with db.begin():
            deleted = db.execute(statement, params).rowcount  # type: ignore[call-overload]
        if deleted < params["n"]:
            return
        time.sleep(max(PAUSE_S, time.monotonic() - started))
