"""The supervisor's tick: it ends the runs whose processes ended, escalates stops past their grace, notes restarts,
stalls and a scheduler's word on a job, and has admission start what fits. Every run is asked of its launcher."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from app.core import priorities
from app.core.folders import RunFolders
from app.core.models import Run, RunStatus, utcnow
from app.launcher.interface import JobView, Launcher
from app.launcher.launchers import Launchers
from app.services import admission, alerts, checkpoints, files, health, logs, metrics, queue
from app.services.lifecycle import transitions
from app.services.runs import SCRIPT_WORKLOAD
from app.services.scheduling import PREEMPTED
from app.store import metrics as metric_store
from app.store import runs as run_store

ACTIVE = (RunStatus.starting, RunStatus.running, RunStatus.stopping)
NO_REPORTS = "its processes are up; its script reports nothing to the dashboard (no report.log call yet)"


def supervise(
    db: Session,
    *,
    launchers: Launchers,
    folders: RunFolders,
    grace: timedelta,
    stall_after: timedelta,
    alert_rules: alerts.AlertRules | None = None,
) -> None:
    """One tick: end the runs whose processes ended, escalate stops past their grace, note the live runs that stopped
    progressing (or move again), raise the alerts of what changed (queued: sent after this commits), start what
    fits."""
    with db.begin():
        watched = run_store.runs_to_supervise(db, active=ACTIVE, host=queue.host_launchers(launchers))
        active = [run for run in watched if run.status in ACTIVE or run.job_id]
        for each in launchers.watching():
            each.refresh([run for run in active if run.launcher == each.name])
        for run in active:
            launcher = launchers.named(run.launcher)
            if launcher is None:
                continue  # a server started without Slurm leaves Slurm's runs as they are
            _observe(db, run, launcher=launcher)
            _check_active(db, run, launcher=launcher, folders=folders, grace=grace)
            _note_processes_up(db, run, folders=folders)
            health.record(db, run, now=utcnow(), stall_after=stall_after)  # only a run still running, so alive
        # The server's settings, as its launchers were made with: the queue's limits, preemption and fair share.
        admission.start_queued(db, watched=watched, launchers=launchers, active=ACTIVE,
                               settings=launchers.local.settings)  # fmt: skip
        if alert_rules is not None:  # queued runs too: one Slurm refused fails here, one resumed clears its alert
            alerts.check(db, runs=watched, rules=alert_rules, now=utcnow())


def _observe(db: Session, run: Run, *, launcher: Launcher) -> None:
    """Keeps what the scheduler says of the run's job, with an event when its state or pending reason changes."""
    job = launcher.observe(run)
    if job is None or (job.state, job.reason, job.nodes) == (run.job_state, run.job_reason, run.node_list):
        return
    changed = job.state != run.job_state or (job.waiting and job.reason != run.job_reason)
    run.job_state, run.job_reason, run.node_list = job.state, job.reason, job.nodes
    if changed:
        transitions.move(db, run, _status_of_job(run, job), job.words)


def _status_of_job(run: Run, job: JobView) -> RunStatus:
    """Queued while the job waits in its scheduler's queue, starting once it has nodes; running and stopping stay."""
    if job.waiting and run.status == RunStatus.starting:
        return RunStatus.queued
    if job.running and run.status == RunStatus.queued:
        return RunStatus.starting
    return run.status


def _check_active(db: Session, run: Run, *, launcher: Launcher, folders: RunFolders, grace: timedelta) -> None:
    exit_code = launcher.exit_code(run)
    if exit_code is not None:
        if not _requeued(db, run, launcher=launcher, folders=folders):
            _end(db, run, launcher=launcher, folders=folders, exit_code=exit_code)
    elif not launcher.is_alive(run):
        # The waiter itself is gone without recording an exit (killed after a stop, or by someone else), or the
        # processes of a run launched elsewhere fell silent.
        _end(db, run, launcher=launcher, folders=folders, exit_code=None)
    elif launcher.kills and run.stop_requested_at is not None and utcnow() - run.stop_requested_at > grace:
        killed = launcher.kill(run)
        transitions.move(db, run, RunStatus.stopping, f"grace period over: killed {killed} processes")
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
        transitions.move(db, run, RunStatus.running, NO_REPORTS)


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
        transitions.move(db, run, RunStatus.queued, f"attempt {run.attempt}: {requeue.reason}")
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
        transitions.move(db, run, run.status, reason)


def _end(db: Session, run: Run, *, launcher: Launcher, folders: RunFolders, exit_code: int | None) -> None:
    """A run whose processes ended: back to the queue when they stopped for a higher-priority run (unless training
    finished meanwhile), else finished."""
    if run.preempted_by is not None and not folders.trainer_finished(run):
        _requeue_preempted(db, run, launcher=launcher, folders=folders, exit_code=exit_code)
    else:
        _finish(db, run, launcher=launcher, folders=folders, exit_code=exit_code)


def _requeue_preempted(db: Session, run: Run, *, launcher: Launcher, folders: RunFolders,
                       exit_code: int | None) -> None:  # fmt: skip
    """The preempted run waits in the queue again at its priority, to resume from the checkpoint it wrote at its
    stop, as a resumed run does (services.runs.resume_run), as the same run."""
    launcher.kill(run)  # whatever torchrun left behind
    recovered = metrics.ingest_leftover_spools(db, run_id=run.id, run_dir=folders.run_dir(run))
    snapshot = checkpoints.newest_checkpoint(folders.checkpoint_dir(run))
    by = run.preempted_by
    run.exit_code = run.stop_requested_at = run.preempted_by = run.devices = None
    run.token_hash = run.pid = run.pid_start_ticks = run.launch_id = None
    run.restarts = 0
    killed = "; its processes did not end within the grace period and were killed" if exit_code is None else ""
    where = f"resumes from {snapshot}" if snapshot else "starts again: it had saved no checkpoint"
    reason = f"{PREEMPTED} {by}: back in the queue at priority {priorities.name(run.priority)}; {where}{killed}"
    if recovered:
        reason += f"; {recovered} points the trainer could not send were recovered from its spool"
    transitions.move(db, run, RunStatus.queued, reason)


def _finish(db: Session, run: Run, *, launcher: Launcher, folders: RunFolders, exit_code: int | None) -> None:
    launcher.kill(run)  # whatever torchrun left behind; a finished run owns no process
    recovered = metrics.ingest_leftover_spools(db, run_id=run.id, run_dir=folders.run_dir(run))
    status, reason = final_status(
        exit_code=exit_code,
        stop_requested=run.stop_requested_at is not None,
        trainer_finished=folders.trainer_finished(run),
        verdict=launcher.verdict(run),
        killed=launcher.kills,
    )
    run.exit_code = exit_code
    run.finished_at = utcnow()
    run.devices = None
    run.final_loss = metric_store.last_value(db, run_id=run.id, key="loss")
    if status == RunStatus.failed and (why := files.checkpoint_failure(run, folders=folders)):
        reason = f"{reason}: {why}"
    if recovered:
        reason += f"; {recovered} points the trainer could not send were recovered from its spool"
    transitions.move(db, run, status, reason)


def final_status(
    *, exit_code: int | None, stop_requested: bool, trainer_finished: bool,
    verdict: tuple[RunStatus, str] | None = None, killed: bool = True,
) -> tuple[RunStatus, str]:  # fmt: skip
    """How a run ended: the trainer's own marker first, then a stop asked for, then the launcher's `verdict` (a job
    Slurm cancelled, timed out or lost a node of; a run launched elsewhere gone silent), then the exit code. torchrun
    exits 1 after a graceful stop, and Slurm then says FAILED or CANCELLED: neither may overrule the first two.
    `killed`: a stopped run's processes that left no exit record were killed past the grace (its launcher kills)."""
    if trainer_finished:
        if exit_code == 0:
            return RunStatus.succeeded, "training finished"
        # torch 2.13 with gloo sometimes aborts a rank after the last step; the trainer's marker is the truth.
        return RunStatus.succeeded, f"training finished (torchrun then exited with {exit_code})"
    if stop_requested:
        # torchrun exits 1 after passing SIGTERM on to ranks that then checkpoint and exit: said, it reads as an error.
        gone = exit_code is None and killed
        return RunStatus.stopped, "stopped on request" + (
            "; its processes did not end within the grace period and were killed" if gone else ""
        )
    if verdict is not None:
        return verdict
    if exit_code == 0:
        return RunStatus.succeeded, "torchrun exited with 0"  # a script of the user's own writes no marker
    if exit_code is None:
        return RunStatus.lost, "the run's processes disappeared without recording an exit code"
    return RunStatus.failed, f"torchrun exited with {exit_code} before training finished; see the ranks' output"
