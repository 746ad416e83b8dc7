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
    goodput: float | None  # None while nothing is known (the whole is 0)
    startup_phases: dict[str, float] = Field(default_factory=dict)
    repeated_steps: int = 0
    itemized: bool = True  # every rank sent a ledger
    runs: int = 1
