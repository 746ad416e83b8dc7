"""What runs cost: one run's GPU-hours, energy, money and badput, and usage by user, tag or launcher over a period."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from app.core.errors import RunNotFound
from app.schemas.usage import GroupBy, RunCost, Usage
from app.services import cost, usage
from app.web.api import documented
from app.web.deps import SessionDep, SettingsDep
from app.web.params import RunId

router = APIRouter(prefix="/api", tags=["usage"])

By = Annotated[GroupBy, Query(description="Rows by user (the run's owner), tag, or launcher.")]
From = Annotated[datetime | None, Query(alias="from", description="The period's start, inclusive (ISO 8601; UTC "
                                        "unless it says otherwise); default: since the first run.")]  # fmt: skip
To = Annotated[datetime | None, Query(alias="to", description="The period's end, exclusive; default: now.")]
Format = Annotated[Literal["json", "csv"] | None, Query(alias="format", description="csv: the table as CSV (also "
                                                        "with `Accept: text/csv`).")]  # fmt: skip
CSV_TYPE = "text/csv; charset=utf-8"


def utc(moment: datetime | None) -> datetime | None:
    """A moment with no zone read as UTC."""
    return moment.replace(tzinfo=timezone.utc) if moment is not None and moment.tzinfo is None else moment


@router.get("/runs/{run_id}/cost", response_model=RunCost, responses=documented(RunNotFound),
            summary="GPU-hours (or CPU-hours), energy and cost of a run, and its badput in the same units")  # fmt: skip
def run_cost(run_id: RunId, db: SessionDep, settings: SettingsDep) -> RunCost:
    return cost.cost_of(db, run_id=run_id, prices=settings.gpu_prices)


@router.get("/usage", response_model=Usage,
            responses={200: {"content": {"text/csv": {}}, "description": "The usage, or its table as CSV"}},
            summary="GPU-hours, CPU-hours, kWh, cost, goodput and runs by user, tag or launcher, by week")  # fmt: skip
def usage_report(
    request: Request, db: SessionDep, settings: SettingsDep, by: By = "user", start: From = None, end: To = None,
    output: Format = None,
) -> Usage | Response:  # fmt: skip
    report = usage.usage(db, by=by, start=utc(start), end=utc(end), prices=settings.gpu_prices)
    if output == "csv" or (output is None and "text/csv" in request.headers.get("accept", "")):
        named = f'attachment; filename="rankboard-usage-by-{by}.csv"'
        return Response(usage.as_csv(report), media_type=CSV_TYPE, headers={"Content-Disposition": named})
    return report
