"""Goodput: what share of the time a run (or a set of runs) held its processes went into training, and where the rest
went (app/services/goodput.py lays it out)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class GoodputPart(BaseModel):
    """One named share of the whole, in process-seconds."""

    name: str
    label: str
    seconds: float
    share: float  # of the whole, 0..1


class Goodput(BaseModel):
    """A run's (or a set of runs') goodput: productive seconds over wall seconds x processes, and the rest named."""

    processes: int
    wall_s: float
    total_s: float  # wall_s x processes, summed over runs for a set
    parts: list[GoodputPart]
    goodput: float | None = Field(
        description="Training (new steps) over the whole, 0..1. None while nothing is known: the whole is 0, or the "
        "run is not itemized. For a set of runs: over its itemized runs only."
    )
    startup_phases: dict[str, float] = Field(default_factory=dict)
    repeated_steps: int = 0
    itemized: bool = Field(
        default=True,
        description="Whether the run's time is laid out by part: every rank of every launch sent the built-in "
        "trainer's timings (its goodput ledger). False for a run of a user's script or one launched elsewhere, which "
        "send none: then `goodput` is None, and the parts hold only what the server knows without them (the queue, "
        "the stalls) and `unitemized`, the rest of the time its processes held. For a set of runs: all of them are.",
    )
    runs: int = 1
