"""The shared folder: browse, download (streamed, resumable), inspect checkpoints. Nothing outside it is served."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse

from app.deps import SettingsDep
from app.errors import PathNotFound
from app.schemas import FolderOut, Inspection
from app.services import checkpoints, storage

router = APIRouter(prefix="/api/files", tags=["files"])


class LargeFileResponse(FileResponse):
    # Starlette reads 64 KiB per chunk, each read a hop to a worker thread; 1 MiB reads keep up with the disk.
    chunk_size = 1 << 20


PathQuery = Annotated[str, Query(max_length=4096, description="Relative to the shared folder, '/'-separated.")]


@router.get("", response_model=FolderOut, summary="A folder of the shared storage, with sizes, times, free space")
def list_folder(settings: SettingsDep, path: PathQuery = "") -> FolderOut:
    entries = storage.list_folder(settings.shared, path)
    return FolderOut.model_validate({"path": path, "entries": entries,
                                     "disk": storage.disk_usage(settings.shared)}, from_attributes=True)  # fmt: skip


@router.get("/download", summary="Download a file; supports Range requests, so a broken download resumes")
def download(settings: SettingsDep, path: PathQuery) -> LargeFileResponse:
    file = storage.existing(settings.shared, path)
    if not file.is_file():
        raise PathNotFound(f"{path!r} is a folder; download the files in it one by one")
    return LargeFileResponse(file, filename=file.name, media_type="application/octet-stream")


@router.get("/inspect", response_model=Inspection, summary="A checkpoint's keys, tensors and parameter count")
def inspect(settings: SettingsDep, path: PathQuery) -> Inspection:
    return checkpoints.inspect(settings.shared, path)
