"""What a trainer posts (its batches, in either format) and what series and charts answer."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StringConstraints,
    model_validator,
)
from rankboard import wire

from app.core.request_body import Body, one_of
from app.schemas.common import HostName, MetricValue, Step


class PointIn(Body):
    key: Annotated[str, StringConstraints(min_length=1, max_length=wire.MAX_KEY_LENGTH)]
    step: int = Field(ge=0, le=wire.MAX_STEP)
    value: MetricValue
    rank: int = Field(default=0, ge=0, le=wire.MAX_RANK)
    time: float = 0.0


def _non_finite_names(values: Any) -> Any:
    """NaN and infinities written as strings (as the per-point format writes them) made floats; anything else is
    left to the strict check, which takes no other string (nor true)."""
    if isinstance(values, list) and any(type(value) is str for value in values):
        return [wire.NON_FINITE.get(value, value) if type(value) is str else value for value in values]
    return values


class ColumnIn(Body):
    """The points of one metric from one rank, as equally long arrays: the compact format (`wire.Column`)."""

    key: Annotated[str, StringConstraints(min_length=1, max_length=wire.MAX_KEY_LENGTH)]
    rank: int = Field(default=0, ge=0, le=wire.MAX_RANK)
    steps: list[Step] = Field(max_length=wire.MAX_POINTS_PER_BATCH)
    # Numbers, with NaN/Infinity/-Infinity written bare (as Python's json writes them) or as strings.
    values: Annotated[list[Annotated[float, Field(allow_inf_nan=True)]], BeforeValidator(_non_finite_names)] = Field(
        max_length=wire.MAX_POINTS_PER_BATCH
    )
    times: list[float] = Field(max_length=wire.MAX_POINTS_PER_BATCH)

    @model_validator(mode="after")
    def _equally_long(self) -> ColumnIn:
        if not len(self.steps) == len(self.values) == len(self.times):
            raise ValueError(f"steps, values and times must be equally long (got {len(self.steps)}, "
                             f"{len(self.values)} and {len(self.times)})")  # fmt: skip
        return self


class ProgressIn(Body):
    epoch: int = Field(ge=0, le=wire.MAX_EPOCH)
    epochs: int = Field(ge=0, le=wire.MAX_EPOCH)
    step: int = Field(ge=0, le=wire.MAX_STEP)
    total_steps: int = Field(ge=0, le=wire.MAX_STEP)
    samples_per_s: float = Field(default=0.0, ge=0)
    finished: bool = False
    restart: int = Field(default=0, ge=0, le=1_000_000)


class GpuIn(Body):
    index: int = Field(ge=0, le=1023)
    uuid: str = Field(max_length=100)
    name: str = Field(max_length=200)


class NodeIn(Body):
    """One node's GPU inventory (`wire.Node`): its GPUs, or why NVML gave none."""

    host: HostName
    gpus: list[GpuIn] = Field(default_factory=list, max_length=wire.MAX_GPUS_PER_NODE)
    nvml_error: str | None = Field(default=None, max_length=wire.MAX_NVML_ERROR_LENGTH)


class HeartbeatIn(Body):
    """One rank's "alive at this step" (`wire.Heartbeat`)."""

    rank: int = Field(ge=0, le=wire.MAX_RANK)
    host: HostName
    step: int = Field(ge=0, le=wire.MAX_STEP)


class EndedIn(Body):
    """How one process of a run launched elsewhere ended (`wire.Ended`)."""

    rank: int = Field(ge=0, le=wire.MAX_RANK)
    host: HostName
    how: Annotated[str, one_of(wire.ENDINGS)]
    error: Annotated[str, StringConstraints(max_length=2000)] | None = None


class BatchIn(Body):
    """A batch of metric points from a trainer, with its progress, node inventory and heartbeats (`rankboard.wire`)."""

    points: list[PointIn] = Field(default_factory=list, max_length=wire.MAX_POINTS_PER_BATCH)
    columns: list[ColumnIn] = Field(default_factory=list, max_length=wire.MAX_POINTS_PER_BATCH)
    progress: ProgressIn | None = None
    node: NodeIn | None = None
    heartbeat: HeartbeatIn | None = None
    ended: EndedIn | None = None
    # Several ranks' at once, from a node's relay (rankboard.relay); the singular fields are one rank's own.
    heartbeats: list[HeartbeatIn] = Field(default_factory=list, max_length=wire.MAX_RANKS_PER_BATCH)
    endings: list[EndedIn] = Field(default_factory=list, max_length=wire.MAX_RANKS_PER_BATCH)

    @model_validator(mode="after")
    def _at_most_a_batch(self) -> BatchIn:
        if self.size > wire.MAX_POINTS_PER_BATCH:
            raise ValueError(f"{self.size} points; a batch holds at most {wire.MAX_POINTS_PER_BATCH}")
        return self

    @property
    def all_heartbeats(self) -> list[HeartbeatIn]:
        """Every heartbeat the batch carries, in either field."""
        return [*self.heartbeats, self.heartbeat] if self.heartbeat is not None else self.heartbeats

    @property
    def all_endings(self) -> list[EndedIn]:
        """Every ending the batch carries, in either field."""
        return [*self.endings, self.ended] if self.ended is not None else self.endings

    @property
    def size(self) -> int:
        """How many points the batch carries, in either format."""
        return len(self.points) + sum(len(column.steps) for column in self.columns)


class IngestResult(BaseModel):
    accepted: int = Field(description="Points in the batch.")
    stored: int = Field(description="Points that were new; the rest were already stored (a retry).")
    stop: bool = Field(default=False, description="A run launched elsewhere was asked to stop (report.stop_requested).")
    dump: int | None = Field(None, description="A dump request each rank should answer once; absent when none.")


class PointOut(BaseModel):
    step: int
    rank: int
    value: MetricValue
    time: float


class SeriesOut(BaseModel):
    key: str
    points: list[PointOut]
    next_step: int | None = Field(description="Pass as start_step for the next page; null on the last page.")
    next_rank: int | None = Field(
        description="Pass as start_rank with next_step. 0 when the page ends at a whole step (as it does whenever "
        "limit holds at least one whole step); otherwise the rank of next_step where the next page starts. Null on "
        "the last page."
    )


class ChartRankOut(BaseModel):
    """One rank's buckets, by step: each bucket's last step, its min, max (ignoring NaN) and last value, and the time
    of that last value. The lists are equally long."""

    step: list[int] = Field(description="The highest step in each bucket: where its `last` value was reported.")
    min: list[MetricValue] = Field(description='"NaN" for a bucket that holds only NaN.')
    max: list[MetricValue] = Field(description='"NaN" for a bucket that holds only NaN.')
    last: list[MetricValue] = Field(description="The value at the bucket's highest step.")
    time: list[float] = Field(
        description="When the value at the bucket's highest step was logged (the point's `time`): unix seconds, for a "
        "chart of wall time or time since the start."
    )


class ChartOut(BaseModel):
    """A series downsampled for a chart: at most `width` buckets per rank, each with its min, max and last value (and
    that value's time)."""

    key: str
    start_step: int
    end_step: int
    bucket_steps: int = Field(
        description="Steps per bucket: 1 when the range has no more steps than the width; otherwise rounded up to a "
        "whole pre-aggregated tier (a multiple of 16), and buckets then start at start_step rounded down to that tier."
    )
    ranks: dict[str, ChartRankOut] = Field(description="Per rank (as a string), its buckets; empty without points.")
