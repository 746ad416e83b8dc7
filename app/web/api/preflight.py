"""The preflight check: the ranks' software and GPUs compared, and their all-reduce bandwidth, before training."""

from __future__ import annotations

from fastapi import APIRouter

from app.core.errors import RunNotFound
from app.schemas.preflight import Preflight
from app.services import preflight
from app.web.api import documented
from app.web.deps import FoldersDep, SessionDep
from app.web.params import RunId

router = APIRouter(prefix="/api", tags=["runs"])


@router.get("/runs/{run_id}/preflight", response_model=Preflight | None, responses=documented(RunNotFound),
            summary="The ranks' software and all-reduce bandwidth, compared before training (null: none)")  # fmt: skip
def run_preflight(run_id: RunId, db: SessionDep, folders: FoldersDep) -> Preflight | None:
    return preflight.preflight_of(db, run_id=run_id, folders=folders)
