"""The shared folder: browse, download (streamed, resumable), inspect checkpoints. Nothing outside it is served."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from app.core.errors import NotACheckpoint, PathNotFound, PathOutsideRoot, PathTooLong
from app.schemas.checkpoints import Inspection
from app.schemas.files import FolderOut
from app.services import checkpoints, storage
from app.web.api import documented
from app.web.deps import SettingsDep
from app.web.params import SharedPath

router = APIRouter(prefix="/api/files", tags=["files"])


class LargeFileResponse(FileResponse):
    # Starlette reads 64 KiB per chunk, each read a hop to a worker thread; 1 MiB reads keep up with the disk.
    chunk_size = 1 << 20


PATH_ERRORS = documented(PathOutsideRoot, PathNotFound, PathTooLong)
A_FILE = {"description": "The file's bytes, or the range asked for (206).",
          "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}  # fmt: skip


@router.get("", response_model=FolderOut, responses=PATH_ERRORS,
            summary="A folder of the shared storage, with sizes, times, free space")  # fmt: skip
def list_folder(settings: SettingsDep, path: SharedPath = "") -> FolderOut:
    entries = storage.list_folder(settings.shared, path)
    return FolderOut(path=path, entries=entries, disk=storage.disk_usage(settings.shared))


# Starlette answers a Range header it cannot serve itself, in plain text: 400 when malformed, 416 past the end.
PLAIN = {"text/plain": {"schema": {"type": "string"}}}
BAD_RANGE = {"description": "The Range asked for lies past the file's end.", "content": PLAIN}
DOWNLOAD_ANSWERS = {
    **PATH_ERRORS,
    200: A_FILE,
    206: A_FILE,
    400: {**PATH_ERRORS[400], "content": PLAIN},
    416: BAD_RANGE,
}


# response_class=Response, a class without a media type, keeps FastAPI from documenting the file as JSON.
@router.get("/download", response_class=Response, responses=DOWNLOAD_ANSWERS,
            summary="Download a file; supports Range requests, so a broken download resumes")  # fmt: skip
def download(settings: SettingsDep, path: SharedPath) -> LargeFileResponse:
    file = storage.existing(settings.shared, path)
    if not file.is_file():
        raise PathNotFound(f"{path!r} is a folder; download the files in it one by one")
    return LargeFileResponse(file, filename=file.name, media_type="application/octet-stream")


@router.get("/inspect", response_model=Inspection, responses=documented(PathOutsideRoot, PathNotFound, NotACheckpoint),
            summary="A checkpoint's keys, tensors and parameter count")  # fmt: skip
def inspect(settings: SettingsDep, path: SharedPath) -> Inspection:
    return checkpoints.inspect(settings.shared, path)
