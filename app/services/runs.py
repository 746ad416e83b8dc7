"""Runs: the user's verbs (create, resume, stop) and reading one. The supervisor's tick is app.services.lifecycle."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from app.auth.policy import owner_of
from app.core import priorities
from app.core.errors import FieldInvalid, PathNotFound, PathOutsideRoot, RunNotActive, RunNotFound
from app.core.folders import RunFolders
from app.core.models import Role, Run, RunStatus, utcnow
from app.core.settings import Settings
from app.launcher.launchers import Launchers, kind
from app.schemas.runs import RunCreate
from app.services import admission, checkpoints, storage
from app.services.lifecycle import transitions
from app.store import audit
from app.store import runs as run_store

RESUMABLE = (RunStatus.stopped, RunStatus.failed, RunStatus.lost)
SCRIPT_WORKLOAD = "script"  # the workload of a run of the user's own script


def get_run(db: Session, *, run_id: int) -> Run:
    """The run with this id; raises RunNotFound."""
    run = run_store.get_run(db, run_id)
    if run is None:
        raise RunNotFound(run_id)
    return run


def create_run(
    db: Session, *, spec: RunCreate, settings: Settings, folders: RunFolders, launchers: Launchers,
    actor: str = "local", sweep_of: int | None = None,  # sweep_of: the run whose scaling sweep this is part of
    role: Role = Role.admin,  # the caller's: an operator may give a priority up to settings.operator_priority_max
) -> Run:  # fmt: skip
    """Stores a new run in `queued`, its owner's (the user `actor` acts for); the supervisor starts it when the queue
    lets it (at once for Slurm, which queues it; on this host by priority, within its owner's limits)."""
    if refusal := priorities.refusal(spec.priority, admin=role == Role.admin,
                                     operator_max=settings.operator_priority_max):  # fmt: skip
        raise FieldInvalid("priority", refusal)
    launcher = admission.admit(spec, launchers=launchers)
    with db.begin():
        if spec.init_from:
            spec = spec.model_copy(update={"init_from": checkpoints.checked_init_from(folders.shared,
                                                                                       spec.init_from)})  # fmt: skip
        if spec.script:
            script = checked_script(settings.script_roots, spec.script)
            spec = spec.model_copy(update={"script": script, "workload": SCRIPT_WORKLOAD})
        checkpoints.check_disk_room(db, spec, folders=folders)
        run = Run(**spec.columns(), config=spec.config(), created_by=actor, owner=owner_of(actor), sweep_of=sweep_of)
        run.world_size = launcher.world_size(run)
        db.add(run)
        transitions.move(db, run, RunStatus.queued, f"created; waiting for {launcher.waits_for}")
        audit.record(db, actor=actor, action="created", run_id=run.id)
    return run


def checked_script(roots: Sequence[Path], script: str) -> str:
    """The real path of a run's own script: a .py file inside one of the roots (a relative path is in the first,
    the shared folder). Raises FieldInvalid saying what is wrong."""
    path = Path(script)
    try:
        if path.is_absolute():
            root = next((root for root in roots if path.is_relative_to(root)), None)
            if root is None:
                allowed = " or ".join(str(root) for root in roots)
                raise FieldInvalid("script", f"{script!r} is outside the folders scripts may be in ({allowed})")
            resolved = storage.existing(root, str(path.relative_to(root)), field="script")
        else:
            resolved = storage.existing(roots[0], script, field="script")
    except (PathOutsideRoot, PathNotFound) as error:
        raise FieldInvalid("script", error.message) from None
    if not resolved.is_file() or resolved.suffix != ".py":
        raise FieldInvalid("script", f"{script!r} is not a Python file (*.py)")
    return str(resolved)


def resume_run(db: Session, *, run_id: int, folders: RunFolders, actor: str = "local") -> Run:
    """Queues a stopped, failed or lost run again: it continues as the same run from its newest snapshot."""
    with db.begin():
        run = get_run(db, run_id=run_id)
        if refusal := kind(run.launcher).resume_refusal(run):
            raise RunNotActive(refusal)
        if run.status not in RESUMABLE:
            raise RunNotActive(f"run {run_id} is {run.status.value}; only a stopped, failed or lost run can resume")
        if run.deleting_at is not None:
            raise RunNotActive(f"run {run_id} is being deleted")
        snapshot = checkpoints.newest_checkpoint(folders.checkpoint_dir(run))
        if snapshot is None and not run.script:
            raise RunNotActive(f"run {run_id} has no checkpoint to resume from; start a new run instead")
        run.finished_at = run.exit_code = run.stop_requested_at = run.final_loss = None
        run.token_hash = run.pid = run.pid_start_ticks = run.launch_id = None
        run.job_id = run.job_state = run.job_reason = run.node_list = None
        run.restarts = 0
        where = f"from {snapshot}" if snapshot else "(its script resumes itself)"
        transitions.move(db, run, RunStatus.queued, f"resume requested: continues {where}")
        audit.record(db, actor=actor, action="resumed", run_id=run.id)
    return run


def stop_run(db: Session, *, run_id: int, launchers: Launchers, actor: str = "local") -> Run:
    """Asks a run to stop: a queued run stops at once, a live one is asked through its launcher (SIGTERM and a grace
    period; launched elsewhere, the reply to its processes' next batch)."""
    with db.begin():
        run = get_run(db, run_id=run_id)
        # A tick may be launching it: held and reread, it is stopped once started, not marked stopped and left running.
        run_store.reread_locked(db, run)
        if run.status.is_final:
            raise RunNotActive(f"run {run_id} already ended ({run.status.value})")
        launcher = launchers.for_run(run)
        if refusal := launcher.stop_refusal(run):
            raise RunNotActive(refusal)
        if run.status == RunStatus.queued and run.job_id is None:
            run.finished_at = utcnow()
            transitions.move(db, run, RunStatus.stopped, "stopped before it started")
        elif run.status != RunStatus.stopping:
            run.stop_requested_at = utcnow()
            transitions.move(db, run, RunStatus.stopping, f"stop requested: {launcher.stop_words}")
            launcher.terminate(run)
        elif run.preempted_by is not None:  # stopping for a higher-priority run: it ends stopped, not requeued
            run.preempted_by = None
            transitions.move(db, run, RunStatus.stopping, "stop requested while preempted: it ends stopped")
        audit.record(db, actor=actor, action="stopped", run_id=run.id)
    return run


def elapsed(run: Run, now: datetime | None = None) -> timedelta | None:
    """Time since the run's latest launch, up to when it finished; None while it waits to be launched (again: a
    resumed run keeps its last launch's start until the next one)."""
    if run.started_at is None or run.status == RunStatus.queued:
        return None
    return (run.finished_at or now or utcnow()) - run.started_at
