"""Communication share: how much of each training step waits on DDP's gradient all-reduce."""

from __future__ import annotations

from fastapi import APIRouter

from app.core.errors import RunNotFound
from app.schemas.comm import CommShare
from app.services import comm
from app.web.api import documented
from app.web.deps import SessionDep
from app.web.params import RunId

router = APIRouter(prefix="/api", tags=["runs"])


@router.get("/runs/{run_id}/comm", response_model=CommShare | None, responses=documented(RunNotFound),
            summary="How much of each step waits on the gradient all-reduce (null: no timings reported)")  # fmt: skip
def run_comm(run_id: RunId, db: SessionDep) -> CommShare | None:
    return comm.comm_share_of(db, run_id=run_id)
