"""Liveness and what this server is configured with, for people and for start-up scripts that wait on it."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from app.deps import LauncherDep, SettingsDep

router = APIRouter(prefix="/api", tags=["server"])


class Health(BaseModel):
    status: str
    shared_dir: str
    shared_dir_is_fallback: bool
    launcher: str
    process_slots: int
    gpus: int


@router.get("/health", response_model=Health, summary="Is the server up, and with what")
def health(settings: SettingsDep, launcher: LauncherDep) -> Health:
    return Health(
        status="ok",
        shared_dir=str(settings.shared),
        shared_dir_is_fallback=settings.shared_dir_is_fallback,
        launcher=launcher.name,
        process_slots=launcher.capacity,
        gpus=launcher.gpu_count,
    )
