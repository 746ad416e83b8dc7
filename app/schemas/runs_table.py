"""The runs table and what it does to runs: tags, notes, archive, delete, bulk actions, compare."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
)

from app.core.models import RunStatus
from app.core.request_body import Body
from app.schemas.common import MetricValue


class RunLabels(Body):
    """What PATCH /api/runs/{id} changes; a field left out stays as it is."""

    tags: list[Annotated[str, StringConstraints(max_length=64)]] | None = Field(default=None, max_length=50)
    notes: str | None = Field(default=None, max_length=10_000)
    archived: bool | None = None


class BulkIn(Body):
    """One action on many runs."""

    runs: list[Annotated[int, Field(ge=1, le=2**31 - 1)]] = Field(min_length=1, max_length=500)
    action: Literal["tag", "untag", "archive", "unarchive", "delete"]
    tag: Annotated[str, StringConstraints(max_length=64)] | None = None


class BulkOut(BaseModel):
    done: list[int] = Field(description="The runs acted on.")
    refused: dict[str, str] = Field(default_factory=dict, description="Per run id, why it was not (delete only).")


class RunFolderOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    path: str = Field(description="Relative to the shared folder.")
    bytes: int


class RunDeletionOut(BaseModel):
    """What deleting a run removes (dry_run) or removed."""

    model_config = ConfigDict(from_attributes=True)

    run_id: int
    name: str
    points: int
    folders: list[RunFolderOut] = Field(description="The run's own folders (with files=true), and their sizes.")
    bytes: int
    deleted: bool


class ComparedRunOut(BaseModel):
    """One compared run, as the comparison's summary shows it."""

    id: int
    name: str
    status: RunStatus
    step: int
    total_steps: int
    duration_s: float | None = Field(description="Since its latest launch, up to its end; null before any launch.")
    tags: list[str]


class ComparedOptionOut(BaseModel):
    name: str
    values: list[str] = Field(description="Each run's value, in the runs' order, as the New-run form writes it.")
    differs: bool


class ComparedMetricOut(BaseModel):
    """A metric any compared run has: each run's last value, minimum and maximum, in the runs' order (null for a
    run that never reported it)."""

    key: str
    last: list[MetricValue | None]
    min: list[MetricValue | None]
    max: list[MetricValue | None]


class CompareOut(BaseModel):
    """What the compare page shows; its charts read GET /api/runs/{id}/chart?key=... for each run and metric."""

    runs: list[ComparedRunOut]
    options: list[ComparedOptionOut]
    metrics: list[ComparedMetricOut] = Field(description="Every metric any of the runs has, in the charts' order.")
