"""Goodput: what share of the time a run (or a set of runs) held its processes went into training, and where the rest
went."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.core.errors import RunNotFound
from app.schemas.goodput import Goodput
from app.services import goodput
from app.web.api import documented
from app.web.deps import SessionDep
from app.web.params import RunId

router = APIRouter(prefix="/api", tags=["runs"])

SinceHours = Annotated[
    float | None, Query(gt=0, le=24 * 3650, description="Runs created in the last this many hours; default: all.")
]
NamePrefix = Annotated[str, Query(max_length=100, description="Runs whose name starts with this; default: all.")]


@router.get("/runs/{run_id}/goodput", response_model=Goodput, responses=documented(RunNotFound),
            summary="Productive training time over wall time x processes, and the lost time by part")  # fmt: skip
def run_goodput(run_id: RunId, db: SessionDep) -> Goodput:
    return goodput.goodput_of(db, run_id=run_id)


@router.get("/goodput", response_model=Goodput,
            summary="Goodput of a set of runs: the last hours, a name prefix (500 newest at most)")  # fmt: skip
def goodput_summary(db: SessionDep, since_hours: SinceHours = None, name_prefix: NamePrefix = "") -> Goodput:
    return goodput.summary(db, since_hours=since_hours, name_prefix=name_prefix)
