"""Typed dependencies for routes: the request's database session, the launcher, the run folders, the settings.

They are `async def`, though they do no I/O, because FastAPI runs a plain `def` dependency in its thread pool: for
a sync route that was three more hand-offs between threads per request (the session's opening and closing, the
launcher), each waiting for the GIL behind every busy thread. Opening a session touches no database; closing one
returns its connection to the pool.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from app.auth.policy import Caller
from app.core.errors import NotAuthenticated
from app.core.folders import RunFolders
from app.core.settings import Settings
from app.launcher.launchers import Launchers
from app.launcher.local import LocalLauncher
from app.services.ingest_totals import IngestTotals


async def get_db(request: Request) -> AsyncIterator[Session]:
    """A session for one request; the service it calls begins and commits the transaction."""
    with request.app.state.sessions() as db:
        yield db


async def get_launcher(request: Request) -> LocalLauncher:
    return request.app.state.launcher


async def get_launchers(request: Request) -> Launchers:
    return request.app.state.launchers


async def get_folders(request: Request) -> RunFolders:
    return request.app.state.folders


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_ingest_counters(request: Request) -> IngestTotals:
    return request.app.state.ingest_counters


async def get_caller(request: Request) -> Caller:
    """Who sent the request, as app.web.guard resolved it (LOCAL while authentication is off)."""
    caller = getattr(request.state, "caller", None)
    if caller is None:  # a public route (app.auth.policy.PUBLIC) has no caller: it must not ask for one
        raise NotAuthenticated("log in first")
    return caller


SessionDep = Annotated[Session, Depends(get_db)]
LauncherDep = Annotated[LocalLauncher, Depends(get_launcher)]
FoldersDep = Annotated[RunFolders, Depends(get_folders)]
LaunchersDep = Annotated[Launchers, Depends(get_launchers)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
CallerDep = Annotated[Caller, Depends(get_caller)]
IngestCountersDep = Annotated[IngestTotals, Depends(get_ingest_counters)]
