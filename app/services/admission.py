"""May this run be queued here, and may it start now: a new run's launcher checks it has room for such a run at all,
and the supervisor's tick starts the queued runs in order, each where its launcher places it."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from sqlalchemy.orm import Session

from app.auth.passwords import sha256
from app.core.models import Run, RunStatus, utcnow
from app.launcher.interface import Launcher, LaunchRefused
from app.launcher.launchers import Launchers
from app.schemas.runs import RunCreate
from app.services.lifecycle import transitions
from app.store import runs as run_store


def admit(spec: RunCreate, *, launchers: Launchers) -> Launcher:
    """The launcher a new run is queued for; FieldInvalid when this server has none of its kind, or no room for it."""
    launcher = launchers.require(spec.launcher)
    launcher.check_fits(spec)
    return launcher


def start_queued(db: Session, *, watched: Sequence[Run], launchers: Launchers, active: Sequence[RunStatus]) -> None:
    """Starts the queued runs that fit, oldest first, each where its launcher places it: a Slurm run is submitted at
    once (Slurm queues it), a local one once this host's slots are free.

    `watched`: the tick's runs (run_store.runs_to_supervise), in the statuses the tick left them in."""
    busy = {device for run in watched if run.status in active for device in run.devices or []}
    free = [slot for slot in launchers.local.slots if slot not in busy]
    blocked: set[str] = set()  # first come, first served: a large run is not overtaken by smaller ones of its launcher
    # A queued run that has a job already waits in its scheduler's queue, not in this one.
    for run in [run for run in watched if run.status == RunStatus.queued and run.job_id is None]:
        launcher = launchers.named(run.launcher)
        if launcher is None or launcher.name in blocked:
            continue
        devices = launcher.places(run, free)
        if devices is None:
            blocked.add(launcher.name)
            continue
        free = [slot for slot in free if slot not in devices]
        _launch(db, run, launcher=launcher, devices=devices)


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
        transitions.move(db, run, RunStatus.failed, f"{launcher.scheduler or launcher.name} refused the job: "
                                                    f"{refused.message}")  # fmt: skip
        return
    run.token_hash = sha256(token)
    run.launch_id, run.pid, run.pid_start_ticks = launch.launch_id, launch.pid, launch.start_ticks
    run.command, run.devices, run.job_id = launch.command, devices, launch.job_id
    run.world_size = launcher.world_size(run)  # the server's settings may have changed since it was queued
    run.attempt = 1
    run.started_at = utcnow()
    # A submitted job waits in its scheduler's queue; local processes start at once.
    transitions.move(db, run, RunStatus.queued if launch.job_id else RunStatus.starting, launch.description)
