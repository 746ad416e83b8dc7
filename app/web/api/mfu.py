"""Model FLOPs utilization: the model FLOP/s a run achieves, against its GPUs' peak."""

from __future__ import annotations

from fastapi import APIRouter

from app.core.errors import RunNotFound
from app.schemas.mfu import Mfu
from app.services import mfu
from app.web.api import documented
from app.web.deps import SessionDep
from app.web.params import RunId

router = APIRouter(prefix="/api", tags=["runs"])


@router.get("/runs/{run_id}/mfu", response_model=Mfu | None, responses=documented(RunNotFound),
            summary="Model FLOP/s achieved, and MFU against the GPU peak (null: no model FLOPs reported)")  # fmt: skip
def run_mfu(run_id: RunId, db: SessionDep) -> Mfu | None:
    return mfu.mfu_of(db, run_id=run_id)
