"""May this run be queued here, and may it start now: a new run's launcher checks it has room for such a run at all,
and the supervisor's tick starts what the queue lets start, each where its launcher places it, and asks lower-priority
runs to stop when a higher one waits for their slots (app.services.scheduling decides; this module acts)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app.auth.passwords import sha256
from app.core import priorities
from app.core.models import Run, RunStatus, utcnow
from app.core.settings import Settings
from app.launcher.interface import Launcher, LaunchRefused
from app.launcher.launchers import Launchers
from app.schemas.runs import RunCreate
from app.services import queue, scheduling
from app.services.lifecycle import transitions
from app.store import queue as queue_store
from app.store import runs as run_store

LIMIT_WAIT = "waiting: "  # how a wait for a limit begins (app.services.scheduling), as a run's reason says it


def admit(spec: RunCreate, *, launchers: Launchers) -> Launcher:
    """The launcher a new run is queued for; FieldInvalid when this server has none of its kind, or no room for it."""
    launcher = launchers.require(spec.launcher)
    launcher.check_fits(spec)
    return launcher


def start_queued(db: Session, *, watched: Sequence[Run], launchers: Launchers, active: Sequence[RunStatus],
                 settings: Settings) -> None:  # fmt: skip
    """Starts the queued runs that may start: a run of another scheduler (Slurm) is submitted at once, with what the
    server's mapping gives its priority and owner (Slurm queues it); this host's runs as the queue decides.

    `watched`: the tick's runs (run_store.runs_to_supervise), in the statuses the tick left them in."""
    for run in [run for run in watched if run.status == RunStatus.queued and run.job_id is None]:
        launcher = launchers.named(run.launcher)
        if launcher is None or launcher.host_slots:
            continue
        devices = launcher.places(run, [])
        if devices is not None:
            _launch(db, run, launcher=launcher, devices=devices, groups=queue_store.groups_of(db, queue.owner_of(run)))
    live = [run for run in watched if run.status in active]
    schedule_host(db, live=live, launchers=launchers, settings=settings, now=utcnow())


def schedule_host(db: Session, *, live: Sequence[Run], launchers: Launchers, settings: Settings,
                  now: datetime) -> None:  # fmt: skip
    """One decision over this host's queue (read as rows: it may be long): the runs it admits start, the runs it
    preempts are asked to stop, and a run's reason changes where a limit holds it, or no longer does."""
    host = queue.host_launchers(launchers)
    waiting = queue.waiting_of(queue_store.waiting(db, launchers=host))
    if not waiting:
        return
    live = [run for run in live if run.launcher in host]
    holding = queue.holding_of(live, now=now, interval=timedelta(seconds=settings.preempt_interval_s))
    rules = queue.policy(db, settings=settings, launchers=launchers, owners={w.owner for w in waiting}, now=now)
    decision = scheduling.decide(waiting, holding, rules)
    by_id = {run.id: run for run in live}
    head = next((run for run in waiting if run.id == decision.head), None)
    for victim in decision.preempted:
        assert head is not None  # the runs preempted make room for the head
        _preempt(db, by_id[victim], by=head, launcher=launchers.for_run(by_id[victim]), now=now)
    busy = {device for run in live for device in run.devices or []}
    free = [slot for slot in launchers.local.slots if slot not in busy]
    for run_id in decision.admitted:
        run = run_store.get_run(db, run_id)
        launcher = launchers.named(run.launcher) if run else None
        devices = launcher.places(run, free) if run and launcher else None
        if run is None or launcher is None or devices is None:
            continue  # gone since the queue was read, or this host's devices disagree with the count: next tick
        free = [slot for slot in free if slot not in devices]
        _launch(db, run, launcher=launcher, devices=devices, groups=rules.member_of.get(queue.owner_of(run), ()))
    said = queue_store.reasons_saying(db, launchers=host, said=LIMIT_WAIT)
    _note_waits(db, decision, said=said, launchers=launchers)


def _preempt(db: Session, run: Run, *, by: scheduling.Waiting, launcher: Launcher, now: datetime) -> None:
    """Asks a run to stop for a higher-priority one: it checkpoints and, once ended, waits in the queue again."""
    run_store.reread_locked(db, run)
    if run.status != RunStatus.running:
        return  # stopped or ended since the tick read it
    run.stop_requested_at = run.preempted_at = now
    run.preempted_by = by.id
    reason = f"{scheduling.PREEMPTED} {by.id} (priority {priorities.name(by.priority)}): {launcher.stop_words}"
    transitions.move(db, run, RunStatus.stopping, reason)
    launcher.terminate(run)


def _note_waits(db: Session, decision: scheduling.Decision, *, said: dict[int, str], launchers: Launchers) -> None:
    """A run's reason says what holds it where a person must know: a limit, or the runs preempted for it; a limit
    that no longer holds it is taken back (`said`: the runs whose reason is a limit's now). Written only when it
    changes: an event each time, not each tick."""
    wanted = {run_id: decision.waits[run_id] for run_id in decision.over_limit}
    if decision.head is not None and decision.preempted:
        wanted[decision.head] = decision.waits[decision.head]
    for run_id in set(said) - set(wanted) - set(decision.admitted):
        wanted[run_id] = ""  # the waiting its launcher says, below
    for run_id, reason in wanted.items():
        if reason == said.get(run_id):
            continue
        run = run_store.get_run(db, run_id)
        if run is None or run.status != RunStatus.queued:
            continue
        launcher = launchers.named(run.launcher)
        transitions.move(
            db, run, RunStatus.queued, reason or f"waiting for {launcher.waits_for if launcher else 'room'}"
        )


def _launch(db: Session, run: Run, *, launcher: Launcher, devices: list[int], groups: Sequence[str]) -> None:
    # The tick read the run before it held the database: a stop may have ended it since (a resumed run stopped at
    # once was started all the same). Reread with the row held, so that nothing changes it until this commits.
    run_store.reread_locked(db, run)
    if run.status != RunStatus.queued:
        return
    mapped = launcher.scheduler_options(run, groups=groups)
    for column, value in mapped.items():
        setattr(run, column, value)
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
    said = ", ".join(f"{column.removeprefix('slurm_')} {value}" for column, value in mapped.items())
    described = f"{launch.description} (by the server's mapping: {said})" if mapped else launch.description
    # A submitted job waits in its scheduler's queue; local processes start at once.
    transitions.move(db, run, RunStatus.queued if launch.job_id else RunStatus.starting, described)
