"""Charts: a run's series downsampled to a chart's width, per bucket its min, max and last value (and its time)."""

from __future__ import annotations

from fastapi import APIRouter

from app.core.errors import FieldInvalid, RunNotFound, SeriesNotFound
from app.schemas.metrics import ChartOut
from app.services import charts
from app.web.api import documented
from app.web.deps import SessionDep
from app.web.params import ChartEnd, ChartStart, MetricKeyQuery, RankFilter, RunId, Width

router = APIRouter(prefix="/api/runs", tags=["charts"])


@router.get("/{run_id}/chart", response_model=ChartOut, responses=documented(RunNotFound, SeriesNotFound, FieldInvalid),
            summary="A series downsampled to a width: min, max, last and its time")  # fmt: skip
def chart(
    run_id: RunId,
    db: SessionDep,
    key: MetricKeyQuery,
    start_step: ChartStart = None,
    end_step: ChartEnd = None,
    width: Width = 1000,
    rank: RankFilter = None,
) -> ChartOut:
    return charts.chart(db, run_id=run_id, key=key, start_step=start_step, end_step=end_step, width=width, rank=rank)
