"""Communication share: how much of each training step waits on DDP's gradient all-reduce (app/services/comm.py)."""

from __future__ import annotations

from pydantic import BaseModel


class CommShare(BaseModel):
    """Means over the ranks, per step, of the last WINDOW_STEPS steps; `share` is exposed communication's part."""

    share: float
    comm_ms: float  # exposed: the step waited for it
    step_ms: float
    allreduce_ms: float  # launch to completion, summed over buckets; what exceeds comm_ms hid behind backward
    backward_ms: float
    optimizer_ms: float
    buckets: float
    ranks: int
    per_rank: dict[int, float]  # each rank's share
