"""This server's host: its GPUs now and which run holds each, or its CPU and memory where there is no GPU."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.schemas.host import HostOut
from app.services import host
from app.web.deps import SessionDep

router = APIRouter(prefix="/api", tags=["server"])


@router.get("/host", response_model=HostOut, summary="This host's GPUs now, and the runs that hold them")
def host_status(request: Request, db: SessionDep) -> HostOut:
    # A sync function: FastAPI runs it in its threadpool, so NVML's reads never block the event loop.
    return host.host_status(db, sampler=request.app.state.host_sampler)
