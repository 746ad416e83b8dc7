"""A run's checkpoints: listed, inspected, deleted."""

from __future__ import annotations

from datetime import datetime

from pydantic import (
    BaseModel,
    Field,
)
from rankboard import wire

from app.schemas.common import MetricValue


class CheckpointOut(BaseModel):
    name: str
    path: str = Field(description="Relative to the shared directory; pass it to /api/files/download or /inspect.")
    size: int
    modified: datetime
    step: int
    epoch: int | None = None
    metrics: dict[str, MetricValue] = Field(default_factory=dict, description="The trainer's metrics at save time.")
    reason: str | None = Field(
        default=None, description=f"Why it was written: one of {', '.join(wire.CHECKPOINT_REASONS)}."
    )
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
