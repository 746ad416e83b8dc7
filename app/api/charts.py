"""Charts: a run's series downsampled to a chart's width, per bucket its min, max and last value."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.deps import SessionDep
from app.schemas import ChartOut
from app.services import charts
from trainer import wire

router = APIRouter(prefix="/api/runs", tags=["charts"])


@router.get("/{run_id}/chart", response_model=ChartOut, summary="A series downsampled to a width: min, max, last")
def chart(
    run_id: int,
    db: SessionDep,
    key: Annotated[str, Query(min_length=1, max_length=wire.MAX_KEY_LENGTH, description="The metric, e.g. loss.")],
    start_step: Annotated[int | None, Query(ge=0, le=2**62, description="Default: the series' first step.")] = None,
    end_step: Annotated[int | None, Query(ge=0, le=2**62, description="Default: the series' last step.")] = None,
    width: Annotated[int, Query(ge=1, le=4000, description="The chart's width in pixels.")] = 1000,
    rank: Annotated[int | None, Query(ge=0, le=1_000_000, description="Default: every rank.")] = None,
) -> ChartOut:
    return charts.chart(db, run_id=run_id, key=key, start_step=start_step, end_step=end_step, width=width, rank=rank)
