"""Runs launched elsewhere: the user's own sbatch, torchrun or Kubernetes job reports into one run.

No launcher owns their processes, so what a launcher would see comes from the processes themselves: each joins
the run of its job's key (`join`), posts batches like any trainer (`took_batch` keeps the time of the last, and
brings back a run that was declared lost), and says how it ended (`ended`). Their launcher
(app.launcher.external.ExternalLauncher) tells the supervisor's tick that a run whose processes all fell silent is
lost; one that reports again comes back. A stop reaches the script only if it said it reads
`report.stop_requested()`.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.auth.passwords import sha256
from app.core.models import Run, RunStatus, RunToken, utcnow
from app.launcher.external import ExternalLauncher
from app.schemas.metrics import EndedIn
from app.schemas.runs import JoinIn, JoinOut
from app.services.lifecycle import transitions
from app.store import audit
from app.store import metrics as metric_store
from app.store import ranks as rank_store
from app.store import runs as run_store

EXTERNAL = ExternalLauncher.name  # the launcher, and the workload, of a run launched elsewhere


def join(db: Session, *, spec: JoinIn, shared: Path, actor: str) -> JoinOut:
    """The run of the job's key, made by the first process that asks; each process gets its own ingest token."""
    token = secrets.token_urlsafe(32)
    try:
        return _join_once(db, spec=spec, shared=shared, actor=actor, token=token)
    except IntegrityError:
        # Another process of the job made the run between our read and our insert: its transaction won, so the
        # run is there now. (Its rows are committed, ours were rolled back: nothing is half-written.)
        return _join_once(db, spec=spec, shared=shared, actor=actor, token=token)


def _join_once(db: Session, *, spec: JoinIn, shared: Path, actor: str, token: str) -> JoinOut:
    with db.begin():
        run = run_store.run_by_external_key(db, spec.key)
        created = run is None
        if run is None:
            run = _new_run(db, spec=spec, actor=actor, checkpoints=_in_shared(spec.checkpoint_dir, shared))
        elif run.status.is_final:
            _reopen(db, run, f"rank {spec.rank} on {spec.host} joined again")
        run.world_size = spec.world_size  # an elastic job may come back with another size
        if spec.total_steps:  # declared before any step is: the page shows progress against it from the start
            run.total_steps = spec.total_steps
        db.add(RunToken(token_hash=sha256(token), run_id=run.id))
        db.flush()
    return JoinOut(run_id=run.id, token=token, created=created)


def _in_shared(folder: str | None, shared: Path) -> str | None:
    """The script's checkpoint folder relative to the shared folder; None when it names none, or one outside it."""
    if not folder:
        return None
    resolved, root = Path(folder).resolve(), shared.resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) and resolved != root else None


def _new_run(db: Session, *, spec: JoinIn, actor: str, checkpoints: str | None) -> Run:
    now = utcnow()
    run = Run(
        name=spec.name, launcher=EXTERNAL, workload=EXTERNAL,
        external_key=spec.key, config=spec.config, world_size=spec.world_size, takes_stop=spec.takes_stop,
        nproc_per_node=spec.local_world_size, slurm_nodes=max(1, spec.world_size // spec.local_world_size),
        created_by=actor, started_at=now, contact_at=now, attempt=1, checkpoint_folder=checkpoints,
    )  # fmt: skip
    reason = f"launched elsewhere ({spec.key}); rank {spec.rank} on {spec.host} joined first"
    if spec.checkpoint_dir and checkpoints is None:
        reason += f"; its checkpoint folder {spec.checkpoint_dir} is not in the shared folder, so none are listed"
    db.add(run)
    # Its first move flushes it: a second process's insert of the same key fails there, before anything else is written.
    transitions.move(db, run, RunStatus.starting, reason)
    audit.record(db, actor=actor, action="created", run_id=run.id)
    return run


def _reopen(db: Session, run: Run, joined: str) -> None:
    """A process joined a run that had ended: its job was restarted where it runs, which is a requeue by its own
    scheduler (Slurm's, torchrun's), so the run goes through `queued` as the next attempt, and starts."""
    run.finished_at = run.final_loss = run.stop_requested_at = None
    run.trainer_finished = False
    run.attempt += 1
    run.contact_at = run.started_at = utcnow()
    rank_store.clear_endings(db, run_id=run.id)
    transitions.move(db, run, RunStatus.queued, f"attempt {run.attempt}: its job was restarted where it runs")
    transitions.move(db, run, RunStatus.starting, f"attempt {run.attempt}: {joined}")


def took_batch(db: Session, run: Run) -> None:
    """A batch came from one of the run's processes: note the time; a run declared lost is alive after all.

    `lost` said only that its processes fell silent (the server may have been cut off from them): it comes back as
    a requeue of the same attempt, through `queued`, which is the one way out of an end."""
    run.contact_at = utcnow()
    if run.status == RunStatus.lost:
        run.finished_at = None
        transitions.move(db, run, RunStatus.queued, "its processes report again: the silence was not their end")
        transitions.move(db, run, RunStatus.running, "reporting again after a silence")


def ended(db: Session, run: Run, ending: EndedIn) -> None:
    """One process says how it ended: a rank that raised fails the run; once every rank has ended, it is over."""
    # Two ranks ending at once: the second to take the row's lock reads what the first wrote, so one sees both.
    run_store.reread_locked(db, run, "status")
    db.refresh(run, attribute_names=["trainer_finished", "stop_requested_at", "world_size"])
    if run.status.is_final:
        return
    rank_store.set_ending(db, run_id=run.id, rank=ending.rank, host=ending.host, how=ending.how, at=utcnow())
    if ending.how == "finished":
        run.trainer_finished = True
    if ending.how == "failed":
        error = ending.error or "an exception"
        _finish(db, run, RunStatus.failed, f"rank {ending.rank} on {ending.host} raised {error}")
        return
    endings = rank_store.endings(db, run_id=run.id)
    if len(endings) < (run.world_size or 1):
        return
    if run.stop_requested_at is not None:
        _finish(db, run, RunStatus.stopped, f"stopped on request: all {len(endings)} ranks ended")
    elif run.trainer_finished:
        _finish(db, run, RunStatus.succeeded, f"training finished: all {len(endings)} ranks ended")
    else:
        _finish(db, run, RunStatus.succeeded, f"all {len(endings)} ranks' processes exited without an error")


def _finish(db: Session, run: Run, status: RunStatus, reason: str) -> None:
    run.finished_at = utcnow()
    run.final_loss = metric_store.last_value(db, run_id=run.id, key="loss")
    transitions.move(db, run, status, reason)
