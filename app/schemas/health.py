"""A running run's health: which ranks stalled, whether their GPUs spin, each rank's last heartbeat. The answers
app/services/health.py builds, for the API and the run page alike."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.forensics import StragglerOut

HealthState = Literal["ok", "not_progressing", "hung_collective"]


class StalledRankOut(BaseModel):
    """A rank whose heartbeat went stale."""

    rank: int
    host: str
    step: int = Field(description="The last step the rank reported.")
    heartbeat_at: datetime
    silent_s: float = Field(description="Seconds since that heartbeat.")


class GpuSpinOut(BaseModel):
    """GPUs busy but drawing little power over the last 30 s: means over those that show it."""

    gpus: int = Field(description="How many GPUs show it ...")
    of: int = Field(description="... of how many with util and power samples in the window.")
    util: float = Field(description="%")
    power: float = Field(description="W")
    power_limit: float = Field(description="W")


class RankOut(BaseModel):
    """One rank's own last heartbeat, and how its process ended (runs launched elsewhere)."""

    model_config = ConfigDict(from_attributes=True)

    rank: int
    host: str
    step: int
    heartbeat_at: datetime
    ended: str | None = Field(description="A run launched elsewhere: finished, exited or failed; null while it runs.")


class HealthOut(BaseModel):
    """Whether a running run progresses; "ok" for a run in any other state."""

    state: HealthState
    message: str = Field(description="The sentence a person reads; empty when ok.")
    stalled: list[StalledRankOut]
    behind: list[int] = Field(description="Ranks whose last step is below the highest rank's.")
    gpu: GpuSpinOut | None = Field(description="The hung-collective signature, when that is what the GPUs show.")
    stragglers: list[StragglerOut] = Field(
        default_factory=list, description="Ranks still slow in data wait or compute against the others; see findings."
    )
