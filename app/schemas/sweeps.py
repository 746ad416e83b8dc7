"""Scaling sweeps: a run's config at 1, 2, 4, ... processes, and what each size bought (app/services/sweeps.py)."""

from __future__ import annotations

from pydantic import BaseModel


class SweepRow(BaseModel):
    """One run of a sweep: its size, where it stands, and what it bought."""

    run_id: int
    processes: int
    status: str
    samples_per_s: float
    speedup: float | None  # over the sweep's 1-process run; None until both have a throughput
    efficiency: float | None  # speed-up / processes
    comm_share: float | None


class Sweep(BaseModel):
    """A run's scaling sweep, smallest first; empty when none was started."""

    run_id: int
    rows: list[SweepRow]
