"""The shared folder's files, as the Files page and its API list them."""

from __future__ import annotations

from datetime import datetime

from pydantic import (
    BaseModel,
)


class DiskOut(BaseModel):
    total: int
    used: int
    free: int


class EntryOut(BaseModel):
    name: str
    path: str
    is_dir: bool
    size: int
    size_complete: bool
    modified: datetime


class FolderOut(BaseModel):
    path: str
    entries: list[EntryOut]
    disk: DiskOut
