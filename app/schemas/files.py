"""The shared folder's files, as the Files page and its API list them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel


class DiskOut(BaseModel):
    total: int
    used: int
    free: int


class EntryOut(BaseModel):
    """One item of a folder listing; `size` of a folder is the sum below it (`size_complete` False if capped)."""

    name: str
    path: str  # relative to the shared root, with "/" separators
    is_dir: bool
    size: int
    size_complete: bool
    modified: datetime


class FolderOut(BaseModel):
    path: str
    entries: list[EntryOut]
    disk: DiskOut
