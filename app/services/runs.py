"""Runs: create, list, stop, and the supervisor's tick that moves them through their lifecycle."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from app.errors import FieldInvalid, PathNotFound, PathOutsideRoot, RunNotActive, RunNotFound
from app.launcher.local import LocalLauncher
from app.models import Run, RunStatus, utcnow
from app.schemas import RunCreate
from app.services import checkpoints, files, health, metrics, storage
from app.store import metrics as metric_store
from app.store import runs as run_store
from trainer import wire

ACTIVE = (RunStatus.starting, RunStatus.running, RunStatus.stopping)
RESUMABLE = (RunStatus.stopped, RunStatus.failed, RunStatus.lost)
SCRIPT_WORKLOAD = "script"  # the workload of a run of the user's own script


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def get_run(db: Session, *, run_id: int) -> Run:
    """The run with this id; raises RunNotFound."""
    run = run_store.get_run(db, run_id)
    if run is None:
        raise RunNotFound(run_id)
    return run


def list_runs(db: Session, *, status: RunStatus | None, limit: int, offset: int) -> tuple[Sequence[Run], int]:
    return run_store.list_runs(db, status=status, limit=limit, offset=offset)


def create_run(db: Session, *, spec: RunCreate, launcher: LocalLauncher) -> Run:
    """Stores a new run in `queued`; the supervisor starts it when its processes fit on this host."""
    _check_fits_host(spec, launcher=launcher)
    with db.begin():
        if spec.init_from:
            spec = spec.model_copy(update={"init_from": checkpoints.checked_init_from(launcher.settings.shared,
                                                                                       spec.init_from)})  # fmt: skip
        if spec.script:
            script = checked_script(launcher.settings.script_roots, spec.script)
            spec = spec.model_copy(update={"script": script, "workload": SCRIPT_WORKLOAD})
        checkpoints.check_disk_room(db, spec, launcher=launcher)
        run = Run(**spec.model_dump(exclude={"allow_low_disk"}), status=RunStatus.queued, status_reason="")
        db.add(run)
        db.flush()
        run_store.set_status(db, run, RunStatus.queued, "created; waiting for free process slots")
    return run


def _check_fits_host(spec: RunCreate, *, launcher: LocalLauncher) -> None:
    """What the schema cannot know: this host's process slots, and whether it has the GPUs an option needs."""
    if spec.nproc_per_node > launcher.capacity:
        what = f"{launcher.gpu_count} GPUs" if launcher.gpu_count else f"{launcher.capacity} process slots"
        raise FieldInvalid("nproc_per_node", f"this host has {what}; ask for at most {launcher.capacity}")
    if launcher.gpu_count:
        return
    for option, reason in wire.cuda_only(precision=spec.precision, sync_batchnorm=spec.sync_batchnorm).items():
        raise FieldInvalid(option, f"this host has no GPU: {reason}")
    if spec.nccl_env:
        raise FieldInvalid("nccl_env", "this host has no GPU, so runs use gloo and NCCL never reads these variables")


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


def resume_run(db: Session, *, run_id: int, launcher: LocalLauncher) -> Run:
    """Queues a stopped, failed or lost run again: it continues as the same run from its newest snapshot."""
    with db.begin():
        run = get_run(db, run_id=run_id)
        if run.status not in RESUMABLE:
            raise RunNotActive(f"run {run_id} is {run.status.value}; only a stopped, failed or lost run can resume")
        snapshot = checkpoints.newest_checkpoint(launcher.checkpoint_dir(run))
        if snapshot is None and not run.script:
            raise RunNotActive(f"run {run_id} has no checkpoint to resume from; start a new run instead")
        run.finished_at = run.exit_code = run.stop_requested_at = run.final_loss = None
        run.token_hash = run.pid = run.pid_start_ticks = run.launch_id = None
        run.restarts = 0
        where = f"from {snapshot}" if snapshot else "(its script resumes itself)"
        run_store.set_status(db, run, RunStatus.queued, f"resume requested: continues {where}")
    return run


def stop_run(db: Session, *, run_id: int, launcher: LocalLauncher) -> Run:
    """Asks a run to stop: a queued run stops at once, a live one gets SIGTERM and a grace period."""
    with db.begin():
        run = get_run(db, run_id=run_id)
        if run.status.is_final:
            raise RunNotActive(f"run {run_id} already ended ({run.status.value})")
        if run.status == RunStatus.queued:
            run.finished_at = utcnow()
            run_store.set_status(db, run, RunStatus.stopped, "stopped before it started")
        elif run.status != RunStatus.stopping:
            run.stop_requested_at = utcnow()
            run_store.set_status(db, run, RunStatus.stopping, "stop requested: finishing the step, saving")
            launcher.terminate(run)
    return run


def supervise(db: Session, *, launcher: LocalLauncher, grace: timedelta) -> None:
    """One tick: end the runs whose processes ended, escalate stops past their grace, note the live runs that stopped
    progressing (or move again), start what fits."""
    stall_after = timedelta(seconds=launcher.settings.stall_after_s)
    with db.begin():
        for run in run_store.runs_with_status(db, ACTIVE):
            _check_active(db, run, launcher=launcher, grace=grace)
            health.record(db, run, now=utcnow(), stall_after=stall_after)  # only a run still running, so alive
        _start_queued(db, launcher=launcher)


def _check_active(db: Session, run: Run, *, launcher: LocalLauncher, grace: timedelta) -> None:
    exit_code = launcher.exit_code(run)
    if exit_code is not None:
        _finish(db, run, launcher=launcher, exit_code=exit_code)
    elif not launcher.is_alive(run):
        # The waiter itself is gone without recording an exit: killed after a stop, or by someone else.
        _finish(db, run, launcher=launcher, exit_code=None)
    elif run.stop_requested_at is not None and utcnow() - run.stop_requested_at > grace:
        killed = launcher.kill(run)
        run_store.set_status(db, run, RunStatus.stopping, f"grace period over: killed {killed} processes")
    else:
        _record_restarts(db, run, launcher=launcher)


def _record_restarts(db: Session, run: Run, *, launcher: LocalLauncher) -> None:
    """An event for each restart torchrun made since the last tick, saying which rank died and how."""
    if not run.max_restarts:
        return
    # Each failure torchrun logs is followed by a restart, until max_restarts are spent; the last one ends the run.
    failures = launcher.worker_failures(run)[: run.max_restarts]
    for failure in failures[run.restarts :]:
        run.restarts += 1
        reason = f"restart {run.restarts} of {run.max_restarts}: {failure}; the workers resume from the newest snapshot"
        run_store.set_status(db, run, run.status, reason)


def _finish(db: Session, run: Run, *, launcher: LocalLauncher, exit_code: int | None) -> None:
    launcher.kill(run)  # whatever torchrun left behind; a finished run owns no process
    recovered = metrics.ingest_leftover_spools(db, run_id=run.id, run_dir=launcher.run_dir(run))
    status, reason = final_status(
        exit_code=exit_code,
        stop_requested=run.stop_requested_at is not None,
        trainer_finished=launcher.trainer_finished(run),
    )
    run.exit_code = exit_code
    run.finished_at = utcnow()
    run.devices = None
    run.final_loss = metric_store.last_value(db, run_id=run.id, key="loss")
    if status == RunStatus.failed and (why := files.checkpoint_failure(run, launcher=launcher)):
        reason = f"{reason}: {why}"
    if recovered:
        reason += f"; {recovered} points the trainer could not send were recovered from its spool"
    run_store.set_status(db, run, status, reason)


def final_status(*, exit_code: int | None, stop_requested: bool, trainer_finished: bool) -> tuple[RunStatus, str]:
    """How a run ended, decided from the exit code, whether a stop was asked for, and the trainer's own marker."""
    if trainer_finished:
        if exit_code == 0:
            return RunStatus.succeeded, "training finished"
        # torch 2.13 with gloo sometimes aborts a rank after the last step; the trainer's marker is the truth.
        return RunStatus.succeeded, f"training finished (torchrun then exited with {exit_code})"
    if stop_requested:
        how = "the processes were killed" if exit_code is None else f"torchrun exited with {exit_code}"
        return RunStatus.stopped, f"stopped on request; {how}"
    if exit_code == 0:
        return RunStatus.succeeded, "torchrun exited with 0"  # a script of the user's own writes no marker
    if exit_code is None:
        return RunStatus.lost, "the run's processes disappeared without recording an exit code"
    return RunStatus.failed, f"torchrun exited with {exit_code} before training finished; see the ranks' output"


def _start_queued(db: Session, *, launcher: LocalLauncher) -> None:
    busy = {device for run in run_store.runs_with_status(db, ACTIVE) for device in run.devices or []}
    free = [slot for slot in range(launcher.capacity) if slot not in busy]
    for run in run_store.runs_with_status(db, [RunStatus.queued]):
        if run.nproc_per_node > len(free):
            return  # first come, first served: a large run is not overtaken by smaller ones
        devices, free = free[: run.nproc_per_node], free[run.nproc_per_node :]
        _launch(db, run, launcher=launcher, devices=devices)


def _launch(db: Session, run: Run, *, launcher: LocalLauncher, devices: list[int]) -> None:
    token = secrets.token_urlsafe(32)
    launch = launcher.start(run, token=token, devices=devices)
    run.token_hash = hash_token(token)
    run.launch_id, run.pid, run.pid_start_ticks = launch.launch_id, launch.pid, launch.start_ticks
    run.command, run.devices = launch.command, devices
    run.started_at = utcnow()
    where = f"GPUs {devices}" if launcher.gpu_count else f"{len(devices)} CPU process slots"
    run_store.set_status(db, run, RunStatus.starting, f"torchrun started (pid {launch.pid}) on {where}")


def elapsed(run: Run, now: datetime | None = None) -> timedelta | None:
    """Time since the run's latest launch, up to when it finished; None while it waits to be launched (again: a
    resumed run keeps its last launch's start until the next one)."""
    if run.started_at is None or run.status == RunStatus.queued:
        return None
    return (run.finished_at or now or utcnow()) - run.started_at
