"""Typed dependencies for routes: the request's database session, the launcher, the run folders, the settings."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from app.folders import RunFolders
from app.launcher.launchers import Launchers
from app.launcher.local import LocalLauncher
from app.settings import Settings


def get_db(request: Request) -> Iterator[Session]:
    """A session for one request; the service it calls begins and commits the transaction."""
    with request.app.state.sessions() as db:
        yield db


def get_launcher(request: Request) -> LocalLauncher:
    return request.app.state.launcher


def get_launchers(request: Request) -> Launchers:
    return request.app.state.launchers


def get_folders(request: Request) -> RunFolders:
    return request.app.state.folders


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SessionDep = Annotated[Session, Depends(get_db)]
LauncherDep = Annotated[LocalLauncher, Depends(get_launcher)]
FoldersDep = Annotated[RunFolders, Depends(get_folders)]
LaunchersDep = Annotated[Launchers, Depends(get_launchers)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
