"""Runs: create, list, stop, and the supervisor's tick that moves them through their lifecycle."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from rankboard import wire
from sqlalchemy.orm import Session

from app.core.errors import FieldInvalid, PathNotFound, PathOutsideRoot, RunNotActive, RunNotFound
from app.core.folders import RunFolders
from app.core.models import Run, RunStatus, utcnow
from app.core.settings import Settings
from app.launcher import slurm
from app.launcher.interface import JobView, Launcher, LaunchRefused
from app.launcher.launchers import Launchers
from app.launcher.local import LocalLauncher
from app.schemas.runs import RunCreate
from app.services import alerts, checkpoints, external, files, health, logs, metrics, storage
from app.store import audit
from app.store import metrics as metric_store
from app.store import runs as run_store

ACTIVE = (RunStatus.starting, RunStatus.running, RunStatus.stopping)
RESUMABLE = (RunStatus.stopped, RunStatus.failed, RunStatus.lost)
SCRIPT_WORKLOAD = "script"  # the workload of a run of the user's own script
NO_REPORTS = "its processes are up; its script reports nothing to the dashboard (no report.log call yet)"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def get_run(db: Session, *, run_id: int) -> Run:
    """The run with this id; raises RunNotFound."""
    run = run_store.get_run(db, run_id)
    if run is None:
        raise RunNotFound(run_id)
    return run


def create_run(
    db: Session, *, spec: RunCreate, settings: Settings, folders: RunFolders, launchers: Launchers,
    actor: str = "local", sweep_of: int | None = None,  # sweep_of: the run whose scaling sweep this is part of
) -> Run:  # fmt: skip
    """Stores a new run in `queued`; the supervisor starts it when its processes fit on this host, or submits it to
    Slurm at once (Slurm queues it)."""
    launcher: Launcher
    if spec.launcher == "slurm":
        launcher = launchers.require_slurm()
        _check_fits_slurm(spec, launcher=launcher, settings=settings)
    else:
        launcher = launchers.local
        _check_fits_host(spec, launcher=launcher)
    with db.begin():
        if spec.init_from:
            spec = spec.model_copy(update={"init_from": checkpoints.checked_init_from(folders.shared,
                                                                                       spec.init_from)})  # fmt: skip
        if spec.script:
            script = checked_script(settings.script_roots, spec.script)
            spec = spec.model_copy(update={"script": script, "workload": SCRIPT_WORKLOAD})
        checkpoints.check_disk_room(db, spec, folders=folders)
        run = Run(**spec.model_dump(exclude={"allow_low_disk"}), status=RunStatus.queued, status_reason="",
                  created_by=actor, sweep_of=sweep_of)  # fmt: skip
        run.world_size = launcher.world_size(run)
        db.add(run)
        db.flush()
        audit.record(db, actor=actor, action="created", run_id=run.id)
        waits_for = "submission to Slurm" if run.launcher == "slurm" else "free process slots"
        run_store.set_status(db, run, RunStatus.queued, f"created; waiting for {waits_for}")
    return run


def _check_fits_slurm(spec: RunCreate, *, launcher: slurm.SlurmLauncher, settings: Settings) -> None:
    """What the schema cannot know: the cluster's partitions and their sizes; GPUs for the options that need them."""
    partitions = launcher.partitions()
    if partitions is None:
        raise FieldInvalid("launcher", "Slurm does not answer (sinfo failed); try again, or run on this host")
    partition = spec.slurm_partition or settings.slurm_partition
    if partition is not None and partition not in partitions:
        known = ", ".join(sorted(partitions)) or "none"
        raise FieldInvalid("slurm_partition", f"Slurm has no partition {partition!r}; it has: {known}")
    most = partitions[partition] if partition is not None else max(partitions.values(), default=0)
    if spec.slurm_nodes > most:
        where = f"partition {partition!r}" if partition else "the cluster"
        raise FieldInvalid("slurm_nodes", f"{where} has {most} nodes; ask for at most {most}")
    if spec.slurm_gpus_per_node and spec.nproc_per_node > spec.slurm_gpus_per_node:
        raise FieldInvalid("nproc_per_node", f"one process per GPU: at most {spec.slurm_gpus_per_node} per node")
    if spec.slurm_gpus_per_node:
        return
    for option, reason in wire.cuda_only(precision=spec.precision, sync_batchnorm=spec.sync_batchnorm).items():
        raise FieldInvalid(option, f"the Slurm job asks for no GPU: {reason}")


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


def resume_run(db: Session, *, run_id: int, folders: RunFolders, actor: str = "local") -> Run:
    """Queues a stopped, failed or lost run again: it continues as the same run from its newest snapshot."""
    with db.begin():
        run = get_run(db, run_id=run_id)
        if run.launcher == external.EXTERNAL:
            raise RunNotActive(f"run {run_id} was launched elsewhere: start its job there again, and it rejoins")
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
        run_store.set_status(db, run, RunStatus.queued, f"resume requested: continues {where}")
        audit.record(db, actor=actor, action="resumed", run_id=run.id)
    return run


def stop_run(db: Session, *, run_id: int, launchers: Launchers, actor: str = "local") -> Run:
    """Asks a run to stop: a queued run stops at once, a live one gets SIGTERM and a grace period."""
    with db.begin():
        run = get_run(db, run_id=run_id)
        # A tick may be launching it: held and reread, it is stopped once started, not marked stopped and left running.
        run_store.reread_locked(db, run)
        if run.status.is_final:
            raise RunNotActive(f"run {run_id} already ended ({run.status.value})")
        if run.launcher == external.EXTERNAL:
            external.stop(db, run)
        elif run.status == RunStatus.queued and run.job_id is None:
            run.finished_at = utcnow()
            run_store.set_status(db, run, RunStatus.stopped, "stopped before it started")
        elif run.status != RunStatus.stopping:
            run.stop_requested_at = utcnow()
            run_store.set_status(db, run, RunStatus.stopping, "stop requested: finishing the step, saving")
            launchers.for_run(run).terminate(run)
        audit.record(db, actor=actor, action="stopped", run_id=run.id)
    return run


def supervise(
    db: Session,
    *,
    launchers: Launchers,
    folders: RunFolders,
    grace: timedelta,
    stall_after: timedelta,
    alert_rules: alerts.AlertRules | None = None,
    lost_after: timedelta = external.DEFAULT_LOST_AFTER,
) -> None:
    """One tick: end the runs whose processes ended, escalate stops past their grace, note the live runs that stopped
    progressing (or move again), raise the alerts of what changed (queued: sent after this commits), start what
    fits."""
    with db.begin():
        watched = run_store.runs_to_supervise(
            db, active=ACTIVE, local=launchers.local.name, head=len(launchers.local.slots)
        )
        active = [run for run in watched if run.status in ACTIVE or run.job_id]
        for launcher in launchers.all():
            launcher.refresh([run for run in active if run.launcher == launcher.name])
        for run in active:
            if run.launcher == external.EXTERNAL:
                external.check_silence(db, run, now=utcnow(), lost_after=lost_after)
                health.record(db, run, now=utcnow(), stall_after=stall_after)
                continue
            if run.launcher == "slurm" and launchers.slurm is None:
                continue  # a server started without Slurm leaves Slurm's runs as they are
            launcher = launchers.for_run(run)
            _observe(db, run, launcher=launcher)
            _check_active(db, run, launcher=launcher, folders=folders, grace=grace)
            _note_processes_up(db, run, folders=folders)
            health.record(db, run, now=utcnow(), stall_after=stall_after)  # only a run still running, so alive
        _start_queued(db, watched=watched, launchers=launchers)
        if alert_rules is not None:  # queued runs too: one Slurm refused fails here, one resumed clears its alert
            alerts.check(db, runs=watched, rules=alert_rules, now=utcnow())


def _observe(db: Session, run: Run, *, launcher: Launcher) -> None:
    """Keeps what the scheduler says of the run's job, with an event when its state or pending reason changes."""
    job = launcher.observe(run)
    if job is None or (job.state, job.reason, job.nodes) == (run.job_state, run.job_reason, run.node_list):
        return
    changed = job.state != run.job_state or (job.state in slurm.WAITING and job.reason != run.job_reason)
    run.job_state, run.job_reason, run.node_list = job.state, job.reason, job.nodes
    if changed:
        run_store.set_status(db, run, _status_of_job(run, job), f"Slurm job {run.job_id}: {slurm.describe(job)}")


def _status_of_job(run: Run, job: JobView) -> RunStatus:
    """Queued while the job waits in Slurm's queue, starting once it has nodes; running and stopping stay."""
    if job.state in slurm.WAITING and run.status == RunStatus.starting:
        return RunStatus.queued
    if job.state in slurm.RUNNING and run.status == RunStatus.queued:
        return RunStatus.starting
    return run.status


def _check_active(db: Session, run: Run, *, launcher: Launcher, folders: RunFolders, grace: timedelta) -> None:
    exit_code = launcher.exit_code(run)
    if exit_code is not None:
        if not _requeued(db, run, launcher=launcher, folders=folders):
            _finish(db, run, launcher=launcher, folders=folders, exit_code=exit_code)
    elif not launcher.is_alive(run):
        # The waiter itself is gone without recording an exit: killed after a stop, or by someone else.
        _finish(db, run, launcher=launcher, folders=folders, exit_code=None)
    elif run.stop_requested_at is not None and utcnow() - run.stop_requested_at > grace:
        killed = launcher.kill(run)
        run_store.set_status(db, run, RunStatus.stopping, f"grace period over: killed {killed} processes")
    else:
        _record_restarts(db, run, launcher=launcher)


def _note_processes_up(db: Session, run: Run, *, folders: RunFolders) -> None:
    """A script of the user's that reports nothing would stay `starting` for its whole life: it is `running` once its
    ranks' processes are up, which torchrun's --log-dir shows as it starts them (a folder each, made this launch)."""
    if run.status != RunStatus.starting or run.workload != SCRIPT_WORKLOAD or run.started_at is None:
        return
    launched = run.started_at.timestamp()
    ranks = logs.rank_folders(folders.run_dir(run) / "ranks", nproc_per_node=run.nproc_per_node)
    if any(_changed_since(rank.path, launched) for rank in ranks):
        run_store.set_status(db, run, RunStatus.running, NO_REPORTS)


def _changed_since(path: Path, when: float) -> bool:
    try:
        return path.stat().st_mtime >= when
    except OSError:  # removed meanwhile
        return False


def _requeued(db: Session, run: Run, *, launcher: Launcher, folders: RunFolders) -> bool:
    """True when the run goes on: its job requeued as the next attempt (or waiting to end before it is)."""
    if run.stop_requested_at is not None or folders.trainer_finished(run):
        return False
    requeue = launcher.requeue(run)
    if requeue is None:
        return False
    if not requeue.waiting:
        run.attempt += 1
        run.exit_code = None
        run_store.set_status(db, run, RunStatus.queued, f"attempt {run.attempt}: {requeue.reason}")
    return True


def _record_restarts(db: Session, run: Run, *, launcher: Launcher) -> None:
    """An event for each restart torchrun made since the last tick, saying which rank died and how."""
    if not run.max_restarts:
        return
    # Each failure torchrun logs is followed by a restart, until max_restarts are spent; the last one ends the run.
    failures = launcher.worker_failures(run)[: run.max_restarts]
    for failure in failures[run.restarts :]:
        run.restarts += 1
        reason = f"restart {run.restarts} of {run.max_restarts}: {failure}; the workers resume from the newest snapshot"
        run_store.set_status(db, run, run.status, reason)


def _finish(db: Session, run: Run, *, launcher: Launcher, folders: RunFolders, exit_code: int | None) -> None:
    launcher.kill(run)  # whatever torchrun left behind; a finished run owns no process
    recovered = metrics.ingest_leftover_spools(db, run_id=run.id, run_dir=folders.run_dir(run))
    status, reason = final_status(
        exit_code=exit_code,
        stop_requested=run.stop_requested_at is not None,
        trainer_finished=folders.trainer_finished(run),
        verdict=launcher.verdict(run),
    )
    run.exit_code = exit_code
    run.finished_at = utcnow()
    run.devices = None
    run.final_loss = metric_store.last_value(db, run_id=run.id, key="loss")
    if status == RunStatus.failed and (why := files.checkpoint_failure(run, folders=folders)):
        reason = f"{reason}: {why}"
    if recovered:
        reason += f"; {recovered} points the trainer could not send were recovered from its spool"
    run_store.set_status(db, run, status, reason)


def final_status(
    *, exit_code: int | None, stop_requested: bool, trainer_finished: bool, verdict: tuple[RunStatus, str] | None = None
) -> tuple[RunStatus, str]:
    """How a run ended: the trainer's own marker first, then a stop asked for, then the scheduler's `verdict` (a job
    Slurm cancelled, timed out or lost a node of), then the exit code. torchrun exits 1 after a graceful stop, and
    Slurm then says FAILED or CANCELLED: neither may overrule the first two."""
    if trainer_finished:
        if exit_code == 0:
            return RunStatus.succeeded, "training finished"
        # torch 2.13 with gloo sometimes aborts a rank after the last step; the trainer's marker is the truth.
        return RunStatus.succeeded, f"training finished (torchrun then exited with {exit_code})"
    if stop_requested:
        # torchrun exits 1 after passing SIGTERM on to ranks that then checkpoint and exit: said, it reads as an error.
        killed = "; its processes did not end within the grace period and were killed" if exit_code is None else ""
        return RunStatus.stopped, f"stopped on request{killed}"
    if verdict is not None:
        return verdict
    if exit_code == 0:
        return RunStatus.succeeded, "torchrun exited with 0"  # a script of the user's own writes no marker
    if exit_code is None:
        return RunStatus.lost, "the run's processes disappeared without recording an exit code"
    return RunStatus.failed, f"torchrun exited with {exit_code} before training finished; see the ranks' output"


def _start_queued(db: Session, *, watched: Sequence[Run], launchers: Launchers) -> None:
    """Submits queued Slurm runs (Slurm queues them), and starts the local runs that fit this host's free slots.

    `watched`: the tick's runs (run_store.runs_to_supervise), in the statuses the tick left them in."""
    busy = {device for run in watched if run.status in ACTIVE for device in run.devices or []}
    free = [slot for slot in launchers.local.slots if slot not in busy]
    local_blocked = False
    for run in [run for run in watched if run.status == RunStatus.queued]:
        if run.launcher == "slurm":
            if launchers.slurm is not None and run.job_id is None:
                _launch(db, run, launcher=launchers.slurm, devices=[])
        elif local_blocked or run.nproc_per_node > len(free):
            local_blocked = True  # first come, first served: a large run is not overtaken by smaller ones
        else:
            devices, free = free[: run.nproc_per_node], free[run.nproc_per_node :]
            _launch(db, run, launcher=launchers.local, devices=devices)


def _launch(db: Session, run: Run, *, launcher: Launcher, devices: list[int]) -> None:
    # The tick read the run before it held the database: a stop may have ended it since (a resumed run stopped at
    # once was started all the same). Reread with the row held, so that nothing changes it until this commits.
    run_store.reread_locked(db, run)
    if run.status != RunStatus.queued:
        return
    token = secrets.token_urlsafe(32)
    try:
        launch = launcher.start(run, token=token, devices=devices)
    except LaunchRefused as refused:
        run.finished_at = utcnow()
        run_store.set_status(db, run, RunStatus.failed, f"Slurm refused the job: {refused.message}")
        return
    run.token_hash = hash_token(token)
    run.launch_id, run.pid, run.pid_start_ticks = launch.launch_id, launch.pid, launch.start_ticks
    run.command, run.devices, run.job_id = launch.command, devices, launch.job_id
    run.world_size = launcher.world_size(run)  # the server's settings may have changed since it was queued
    run.attempt = 1
    run.started_at = utcnow()
    # A submitted job waits in Slurm's queue; local processes start at once.
    run_store.set_status(db, run, RunStatus.queued if launch.job_id else RunStatus.starting, launch.description)


def world_size(run: Run) -> int:
    """How many ranks the run has: what its launcher said when it was made and launched, or, launched elsewhere, what
    its job said; for a run stored before runs kept it, its processes per node times its nodes."""
    if run.world_size is not None:
        return run.world_size
    return run.nproc_per_node * (run.slurm_nodes if run.launcher == "slurm" else 1)


def elapsed(run: Run, now: datetime | None = None) -> timedelta | None:
    """Time since the run's latest launch, up to when it finished; None while it waits to be launched (again: a
    resumed run keeps its last launch's start until the next one)."""
    if run.started_at is None or run.status == RunStatus.queued:
        return None
    return (run.finished_at or now or utcnow()) - run.started_at
