"""Which rank, and why: each rank's dump, the verdict, and the findings of the ranks' reports."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import (
    BaseModel,
    Field,
)
from rankboard import wire

from app.core.request_body import Body


class FrameIn(Body):
    file: str = Field(max_length=1000)
    line: int = Field(ge=0)
    function: str = Field(max_length=1000)


class CollectiveIn(Body):
    seq: int = Field(ge=0)
    name: str = Field(max_length=200)
    sizes: str = Field(max_length=1000)


class RankDumpIn(Body):
    """One rank's answer to a dump request; see `rankboard.wire.RankDump`."""

    request: int = Field(ge=1)
    rank: int = Field(ge=0, le=wire.MAX_RANK)
    host: str = Field(max_length=wire.MAX_HOST_LENGTH)
    pid: int = Field(ge=0)
    taken_at: float
    stack: list[FrameIn] = Field(max_length=wire.MAX_DUMP_FRAMES)
    threads: str = Field(max_length=wire.MAX_DUMP_BYTES)
    collectives: list[CollectiveIn] = Field(default_factory=list, max_length=wire.MAX_DUMP_COLLECTIVES)
    recorder_error: str | None = Field(None, max_length=1000)
    step: int | None = Field(None, ge=0, le=wire.MAX_STEP)
    watched_s: float | None = Field(None, ge=0, le=3600)
    moved: bool | None = None


class DumpRequested(BaseModel):
    request: int = Field(description="The request's number; GET .../dumps shows the ranks' answers.")


class RankStateOut(BaseModel):
    """One rank as its dump shows it."""

    rank: int
    host: str
    pid: int
    taken_at: float
    collective: str | None = Field(description="The collective its main thread is inside (all_reduce), or None.")
    last_seq: int | None = Field(description="Its flight recorder's newest collective sequence number.")
    last_collective: str | None
    where: str = Field(description="Its innermost frame in the script's own code: file:line in function.")
    top: list[str] = Field(description="Its main thread's innermost frames, most recent first.")
    threads: str = Field(description="Every thread's stack, as faulthandler prints it.")
    recorder_error: str | None
    step: int | None = Field(description="Its newest heartbeat step when its stack was taken.")
    progress: Literal["moved", "still", "unknown"] = Field(
        description="moved: its collectives or its step went on in the seconds after its stack, or it reported a "
        "newer step since; still: neither went on while it watched; unknown: it had neither to watch."
    )
    watched_s: float | None = Field(description="How long it watched itself after its stack; it stops at a move.")


class DumpOut(BaseModel):
    """The newest dump of a run's ranks, and who it points at."""

    request: int
    requested_at: datetime | None
    expected: int = Field(description="How many ranks the run has.")
    ranks: list[RankStateOut]
    missing: list[int] = Field(description="Ranks that have not answered.")
    culprits: list[int] = Field(
        description="The ranks the others wait for: named only when no rank moved on and all were seen at one moment."
    )
    verdict: str = Field(description="The sentence a person reads.")


class NonFiniteOut(BaseModel):
    """Where the loss first became NaN or infinite."""

    step: int | None = Field(description="The first step with a non-finite loss; None if only the norm was.")
    ranks: list[int] = Field(description="The ranks whose own loss was non-finite at that step.")
    grad_norm_step: int | None = Field(description="The first step with a non-finite gradient norm.")
    sentence: str


class StragglerOut(BaseModel):
    """A rank whose data wait or compute stayed above the other ranks' over several reports."""

    rank: int
    host: str
    part: Literal["data wait", "compute"]
    ms: float = Field(description="Its mean time in that part, per step, over the episode.")
    others_ms: float = Field(description="The other ranks' median over the same reports.")
    since_step: int
    since: datetime
    until_step: int | None = Field(description="The report it caught up at; None while it is still slow.")
    ongoing: bool
    sentence: str


class DivergenceOut(BaseModel):
    """The first fingerprint step at which some ranks' parameters differed from the others'."""

    step: int
    ranks: list[int]
    sentence: str


class FindingsOut(BaseModel):
    """What the ranks' reports say went wrong, and where."""

    nonfinite: NonFiniteOut | None = Field(None, description="The first non-finite loss; None while all were finite.")
    stragglers: list[StragglerOut] = Field(default_factory=list, description="Ongoing first, then past episodes.")
    divergence: DivergenceOut | None = Field(None, description="Replicas that diverged; None while they agree.")


class DumpsOut(BaseModel):
    latest: DumpOut | None = Field(description="The newest request's answers; None before any request.")
