"""The shapes of the REST API: what it accepts (with the limits each field has) and what it answers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, StringConstraints

from app.models import RunStatus
from trainer import wire


def _known_workload(name: str) -> str:
    if name not in wire.WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of: {', '.join(wire.WORKLOADS)}")
    return name


WorkloadName = Annotated[str, AfterValidator(_known_workload), Field(json_schema_extra={"enum": list(wire.WORKLOADS)})]


def _metric_value(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return wire.decode_value(value) if isinstance(value, str) else value


# A metric value: a JSON number, or "NaN" / "Infinity" / "-Infinity", which JSON cannot write as numbers.
MetricValue = Annotated[
    float,
    BeforeValidator(_metric_value),
    PlainSerializer(wire.encode_value, return_type=Any),
]


# What keep-best ranks checkpoints by (wire.CHECKPOINT_METRICS; a test keeps the two the same).
BestMetric = Literal["loss", "epoch_loss"]


class RunCreate(BaseModel):
    """A new run of a built-in workload. The limits here are shown in the form next to each field."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)] = Field(
        default="demo", description="What you will recognise the run by."
    )
    workload: WorkloadName = Field(default="mlp", description="The built-in model and synthetic data set to train.")
    nproc_per_node: int = Field(default=2, ge=1, le=1024, description="Processes (one per GPU) on this node.")
    epochs: int = Field(default=10, ge=1, le=100_000, description="Passes over the data set.")
    batch_size: int = Field(default=64, ge=1, le=65_536, description="Samples per step on each process.")
    lr: float = Field(default=0.001, gt=0, le=10, allow_inf_nan=False, description="AdamW's learning rate.")
    checkpoint_every: int = Field(default=1, ge=1, le=100_000, description="Write a checkpoint every N epochs.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="The same seed on every rank; same seed, same run.")
    keep_last: int = Field(default=0, ge=0, le=10_000, description="Keep the newest N checkpoints; 0 keeps all.")
    keep_best: int = Field(default=0, ge=0, le=10_000, description="Also keep the N best by the best metric.")
    best_metric: BestMetric = Field(
        default="loss", description="Lower is better: the last step's loss, or the epoch's mean loss."
    )
    init_from: Annotated[str | None, BeforeValidator(lambda v: v or None)] = Field(
        default=None, max_length=1000, description="Start from this checkpoint's weights (a path in the shared folder)."
    )
    init_optimizer: bool = Field(default=False, description="With a checkpoint to start from: take its optimizer too.")
    allow_low_disk: bool = Field(
        default=False, description="Start even if its checkpoints are projected not to fit on the shared disk."
    )


class RunEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    at: datetime
    status: RunStatus
    reason: str


class RunOut(BaseModel):
    """A run as the API shows it."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    status: RunStatus
    status_reason: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    workload: str
    nproc_per_node: int
    epochs: int
    batch_size: int
    lr: float
    checkpoint_every: int
    seed: int
    keep_last: int
    keep_best: int
    best_metric: str
    init_from: str | None
    init_optimizer: bool
    command: list[str] | None
    exit_code: int | None
    epoch: int
    step: int
    total_steps: int
    samples_per_s: float
    heartbeat_at: datetime | None
    final_loss: MetricValue | None


class RunDetail(RunOut):
    events: list[RunEventOut]


class RunPage(BaseModel):
    items: list[RunOut]
    total: int
    limit: int
    offset: int


class PointIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: Annotated[str, StringConstraints(min_length=1, max_length=wire.MAX_KEY_LENGTH)]
    step: int = Field(ge=0, le=2**62, strict=True)  # strict: a step is an integer, never "7", 7.0 or true
    value: MetricValue
    rank: int = Field(default=0, ge=0, le=1_000_000, strict=True)
    time: float = Field(default=0.0, allow_inf_nan=False)


class ProgressIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epoch: int = Field(ge=0)
    epochs: int = Field(ge=0)
    step: int = Field(ge=0)
    total_steps: int = Field(ge=0)
    samples_per_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    finished: bool = False


class BatchIn(BaseModel):
    """A batch of metric points from a trainer, with its progress; see `trainer.wire`."""

    model_config = ConfigDict(extra="forbid")

    points: list[PointIn] = Field(default_factory=list, max_length=wire.MAX_POINTS_PER_BATCH)
    progress: ProgressIn | None = None


class IngestResult(BaseModel):
    accepted: int = Field(description="Points in the batch.")
    stored: int = Field(description="Points that were new; the rest were already stored (a retry).")


class PointOut(BaseModel):
    step: int
    rank: int
    value: MetricValue
    time: float


class SeriesOut(BaseModel):
    key: str
    points: list[PointOut]
    next_step: int | None = Field(description="Pass as start_step for the next page; null on the last page.")


class CheckpointOut(BaseModel):
    name: str
    path: str = Field(description="Relative to the shared directory; pass it to /api/files/download or /inspect.")
    size: int
    modified: datetime
    step: int
    epoch: int | None = None
    metrics: dict[str, MetricValue] = Field(default_factory=dict, description="The trainer's metrics at save time.")
    reason: str | None = Field(default=None, description="Why it was written: epoch, stop or final.")
    latest: bool = False
    best: bool = Field(default=False, description="Lowest value of the chosen metric (best_metric) so far.")


class CheckpointRemoval(BaseModel):
    """One checkpoint the retention policy deleted, as the trainer logged it."""

    removed: str
    step: int
    freed: int
    at: float


class Deletion(BaseModel):
    files: list[str]
    freed: int = Field(description="Bytes the deletion frees (or would free, in a dry run).")
    deleted: bool = Field(description="False for a dry run: nothing was deleted.")


class TensorOut(BaseModel):
    name: str
    shape: list[int]
    dtype: str
    numel: int


class Inspection(BaseModel):
    """What a checkpoint holds, read without running any code in it."""

    path: str
    size: int
    keys: dict[str, str] = Field(description="Each top-level key with a short description of its value.")
    tensors: list[TensorOut]
    parameters: int | None = Field(description="Elements of the tensors under 'model'; null without a model.")
    truncated: bool = False


class DiskOut(BaseModel):
    total: int
    used: int
    free: int


class EntryOut(BaseModel):
    name: str
    path: str
    is_dir: bool
    size: int
    size_complete: bool
    modified: datetime


class FolderOut(BaseModel):
    path: str
    entries: list[EntryOut]
    disk: DiskOut
