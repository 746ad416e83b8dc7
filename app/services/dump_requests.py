"""A run's open "dump every rank" request: opened by a person, the API or a stall, handed to the ranks by the
ingest reply (app/services/forensics.py has the rest). Imports no other service, so health and metrics can use it."""

from __future__ import annotations

from datetime import datetime, timedelta

from app.core.models import Run, utcnow

# How long the ranks are asked: a rank answers within a heartbeat interval (2 s) when it can at all; a rank whose
# reporter was away (the server restarting, a network cut) still answers when it comes back within this.
DUMP_OPEN_S = 60


def pending(run: Run, *, now: datetime) -> int | None:
    """The dump request the ranks should answer now, or None: what the ingest reply carries."""
    if run.dump_request is None or run.dump_requested_at is None:
        return None
    return run.dump_request if now - run.dump_requested_at < timedelta(seconds=DUMP_OPEN_S) else None


def ask(run: Run) -> int:
    """Open the next dump request on the run, in the caller's transaction (the supervisor's, on a stall)."""
    run.dump_request = (run.dump_request or 0) + 1
    run.dump_requested_at = utcnow()
    return run.dump_request
