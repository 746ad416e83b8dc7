"""The one writer of a run's status: `move`, against the table of the transitions a run may make.

A final status is left only for `queued`: by Resume (the user's verb), or by a requeue (a scheduler's, seen by the
supervisor's tick, or a job launched elsewhere that its own scheduler restarted, seen when its processes join again).
A run launched elsewhere that was lost and reports again is such a requeue too: `lost` said only that it fell
silent, and it comes back through `queued` as any run that leaves an end does, with an event that says why.

A move to the status a run is in records an event without changing it: a restart, a stall, a job's new state.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.orm import Session

from app.core.errors import RunNotActive
from app.core.models import FINAL_STATUSES, Run, RunEvent, RunStatus

LIVE = frozenset({RunStatus.starting, RunStatus.running, RunStatus.stopping})
# Where a run may go from each status; None is a run being made.
TRANSITIONS: Mapping[RunStatus | None, frozenset[RunStatus]] = {
    None: frozenset({RunStatus.queued, RunStatus.starting}),  # made here; made by the first process that joined
    # Queued: launched (a job: submitted, still queued), or stopped, or failed to submit; a Slurm job may start and
    # report, or even end, before the tick sees it leave Slurm's queue.
    RunStatus.queued: frozenset({RunStatus.queued, *LIVE, *FINAL_STATUSES}),
    # Live: its job back in its scheduler's queue (waiting again, requeued), or on to a later live status, or ended.
    RunStatus.starting: frozenset({RunStatus.queued, *LIVE, *FINAL_STATUSES}),
    RunStatus.running: frozenset({RunStatus.queued, RunStatus.running, RunStatus.stopping, *FINAL_STATUSES}),
    # Stopping: ended, or back in the queue when it stopped for a higher-priority run (preempted, to resume).
    RunStatus.stopping: frozenset({RunStatus.queued, RunStatus.stopping, *FINAL_STATUSES}),
    **{final: frozenset({RunStatus.queued}) for final in FINAL_STATUSES},  # resumed or requeued
}


def move(db: Session, run: Run, status: RunStatus, reason: str) -> None:
    """Moves `run` to `status` and records the event with its reason; RunNotActive when the table refuses it."""
    current: RunStatus | None = run.status  # None while the run is being made
    if status not in TRANSITIONS[current]:
        now = current.value if current is not None else "not made yet"
        raise RunNotActive(f"run {run.id} is {now}: it cannot become {status.value} ({reason})")
    run.status, run.status_reason = status, reason
    if run.id is None:
        db.flush()  # a new run gets its id, which its first event names
    db.add(RunEvent(run_id=run.id, status=status, reason=reason))
