"""Goodput laid out by hand: a run that stalled, was stopped, sat stopped, and was resumed. Plain objects, no
database: `compute` is pure, so each second can be traced to its part."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from app.core.models import Run, RunEvent, RunStatus
from app.services import goodput
from app.services.goodput import _Ledger

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def event(seconds: float, status: RunStatus, reason: str = "") -> RunEvent:
    return RunEvent(at=at(seconds), status=status, reason=reason)


def ledger(attempt: str, start: float, end: float, steps: tuple[int, int], **parts: float) -> _Ledger:
    marks = {"start": at(start).timestamp(), "at": at(end).timestamp(), "first_step": float(steps[0]),
             "step_reached": float(steps[1])}  # fmt: skip
    return _Ledger(attempt, 0, {**parts, **marks})


def test_queue_start_up_stall_stop_and_the_time_sat_stopped_each_in_their_place() -> None:
    run = Run(id=1, name="by hand", created_at=T0, nproc_per_node=1, launcher="local", slurm_nodes=1)
    events = [
        event(0, RunStatus.queued), event(10, RunStatus.starting), event(12, RunStatus.running),
        event(50, RunStatus.running, "not progressing: no rank has reported a new step"),
        event(70, RunStatus.running, "progressing again: the ranks' steps move again"),
        event(100, RunStatus.stopped),  # then 100 s stopped: not held, not counted
        event(200, RunStatus.queued, "resume requested"), event(205, RunStatus.starting),
        event(300, RunStatus.succeeded),
    ]  # fmt: skip
    # Resumed from the stop's checkpoint at step 100: no step is taken twice.
    ledgers = [ledger("a.0", 11, 95, (0, 100), startup_build=4, step=70, checkpoint=10),
               ledger("b.0", 206, 298, (100, 200), startup_build=2, step=90)]  # fmt: skip
    result = goodput.compute(run, events, ledgers, now=at(400))
    parts = {part.name: part.seconds for part in result.parts}
    assert result.wall_s == pytest.approx(200) and result.total_s == pytest.approx(200)
    assert parts == pytest.approx({
        "queue": 10 + 5,
        "startup": (11 - 10) + 4 + (206 - 205) + 2,  # launcher gaps, then the trainers' own build
        "stalls": 20,  # the episode, taken out of the first process's steps
        "training": (70 - 20) + 90,
        "checkpoint": 10,
        "stopping": (100 - 95) + (300 - 298),
    })  # fmt: skip
    assert result.goodput == pytest.approx(140 / 200)
    assert result.startup_phases == pytest.approx({"startup_launch": 2, "startup_build": 6})


def test_a_run_still_queued_is_all_queue_and_a_summary_adds_runs_up() -> None:
    run = Run(id=2, name="waiting", created_at=T0, nproc_per_node=2, launcher="local", slurm_nodes=1)
    waiting = goodput.compute(run, [event(0, RunStatus.queued)], [], now=at(30))
    assert [(p.name, p.seconds) for p in waiting.parts] == [("training", 0.0), ("queue", pytest.approx(60))]
    both = goodput.combine([waiting, waiting])
    assert both.runs == 2 and both.total_s == pytest.approx(120) and both.goodput == 0.0
    assert goodput.combine([]).goodput is None


def test_steps_taken_again_after_a_restart_are_lost_in_proportion() -> None:
    run = Run(id=3, name="restarted", created_at=T0, nproc_per_node=1, launcher="local", slurm_nodes=1)
    events = [event(0, RunStatus.queued), event(0, RunStatus.starting), event(100, RunStatus.succeeded)]
    # The first process reached step 80 (its loss says so, past its last ledger report at 60) and died at 40 s; the
    # second resumed from the checkpoint of step 50, so its first 30 of 50 steps were taken before.
    ledgers = [ledger("a.0", 0, 40, (0, 60), step=40), ledger("a.1", 50, 100, (50, 100), step=50)]
    result = goodput.compute(run, events, ledgers, now=at(100), reached_before={at(50).timestamp(): 80})
    parts = {part.name: part.seconds for part in result.parts}
    assert result.repeated_steps == 30
    assert parts == pytest.approx({"training": 40 + 50 * 20 / 50, "repeated": 50 * 30 / 50, "restarts": 10})


def test_a_scripts_run_is_not_itemized_and_shows_only_what_the_server_knows_of_it() -> None:
    """A user's script sends no ledger: its queue and its stalls (the server's own events) are known, the rest of
    its held time is not told apart, so it gets no goodput figure rather than 0%."""
    run = Run(id=4, name="script", created_at=T0, nproc_per_node=2, launcher="local", slurm_nodes=1, script="t.py")
    events = [
        event(0, RunStatus.queued), event(10, RunStatus.starting), event(12, RunStatus.running),
        event(50, RunStatus.running, "not progressing: no rank has reported a new step"),
        event(70, RunStatus.running, "progressing again: the ranks' steps move again"),
        event(110, RunStatus.succeeded),
    ]  # fmt: skip
    result = goodput.compute(run, events, [], now=at(200))
    parts = {part.name: part.seconds for part in result.parts}
    assert parts == pytest.approx({"queue": 2 * 10, "stalls": 2 * 20, "unitemized": 2 * (100 - 20)})
    assert result.total_s == pytest.approx(2 * 110) and not result.itemized and result.goodput is None

    waiting = goodput.compute(run, [event(0, RunStatus.queued)], [], now=at(30))
    assert not waiting.itemized and waiting.goodput is None  # known before its launch: a script keeps no ledger


def test_a_summary_figures_goodput_over_its_itemized_runs_only() -> None:
    built_in = Run(id=5, name="built-in", created_at=T0, nproc_per_node=1, launcher="local", slurm_nodes=1)
    events = [event(0, RunStatus.queued), event(0, RunStatus.starting), event(100, RunStatus.succeeded)]
    trained = goodput.compute(built_in, events, [ledger("a.0", 0, 100, (0, 50), step=80, data=20)], now=at(100))
    script = Run(id=6, name="script", created_at=T0, nproc_per_node=1, launcher="local", slurm_nodes=1, script="t.py")
    silent = goodput.compute(script, events, [], now=at(100))
    both = goodput.combine([trained, silent])
    assert trained.goodput == pytest.approx(0.8) and both.goodput == pytest.approx(0.8)
    assert not both.itemized and both.total_s == pytest.approx(200)  # the whole still counts every run's time


def test_a_preempted_run_counts_the_time_from_its_stop_to_its_resume_as_preempted() -> None:
    run = Run(id=4, name="preempted", created_at=T0, nproc_per_node=1, launcher="local", slurm_nodes=1)
    events = [
        event(0, RunStatus.queued), event(0, RunStatus.starting), event(1, RunStatus.running),
        event(100, RunStatus.stopping, "preempted by run 9 (priority high): finishing the step, saving"),
        event(104, RunStatus.queued, "preempted by run 9: back in the queue at priority low; resumes from step-50.pt"),
        event(160, RunStatus.starting), event(300, RunStatus.succeeded),
    ]  # fmt: skip
    # The checkpoint at the stop keeps every step: the second process takes none again.
    ledgers = [ledger("a.0", 0, 102, (0, 50), step=100, checkpoint=2), ledger("b.0", 160, 300, (50, 120), step=140)]
    parts = {p.name: p.seconds for p in goodput.compute(run, events, ledgers, now=at(400)).parts}
    assert parts == pytest.approx({"training": 100 + 140, "checkpoint": 2, "preempted": (104 - 102) + (160 - 104)})
    assert goodput.PART_LABELS["preempted"] == "preempted (stopping, waiting to resume)"
