"""Liveness and what this server is configured with, for people and for start-up scripts that wait on it."""

from __future__ import annotations

from fastapi import APIRouter

from app.schemas.server import ServerOut
from app.web.deps import LaunchersDep, SettingsDep

router = APIRouter(prefix="/api", tags=["server"])


@router.get("/health", response_model=ServerOut, summary="Is the server up, and with what")
def health(settings: SettingsDep, launchers: LaunchersDep) -> ServerOut:
    return ServerOut(
        status="ok",
        shared_dir=str(settings.shared),
        shared_dir_is_fallback=settings.shared_dir_is_fallback,
        launcher=launchers.local.name,
        launchers=[launcher.name for launcher in launchers.all()],
        process_slots=launchers.local.capacity,
        gpus=launchers.local.gpu_count,
    )
