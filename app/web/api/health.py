"""Liveness and what this server is configured with, for people and for start-up scripts that wait on it."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from app.web.deps import LaunchersDep, SettingsDep

router = APIRouter(prefix="/api", tags=["server"])


class Health(BaseModel):
    status: str
    shared_dir: str
    shared_dir_is_fallback: bool
    launcher: str = Field(description="Where a run goes when it names no launcher: always this host's.")
    launchers: list[str] = Field(description="Where runs can go: local, and slurm when this server can submit.")
    process_slots: int
    gpus: int


@router.get("/health", response_model=Health, summary="Is the server up, and with what")
def health(settings: SettingsDep, launchers: LaunchersDep) -> Health:
    return Health(
        status="ok",
        shared_dir=str(settings.shared),
        shared_dir_is_fallback=settings.shared_dir_is_fallback,
        launcher=launchers.local.name,
        launchers=[launcher.name for launcher in launchers.all()],
        process_slots=launchers.local.capacity,
        gpus=launchers.local.gpu_count,
    )
