"""`create_app(settings)`: the whole server, built from one Settings object."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from app import logs_pages, pages
from app.api import charts as charts_api
from app.api import files as files_api
from app.api import health
from app.api import host as host_api
from app.api import runs as runs_api
from app.db import make_engine, make_sessionmaker, prepare_schema
from app.errors import FieldInvalid, RankboardError
from app.launcher.local import LocalLauncher
from app.services.host import HostSampler
from app.settings import Settings
from app.stream import SharedFragments
from app.supervisor import Supervisor
from app.templating import make_templates

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app, its database migrated or refused (SchemaMismatch), its supervisor started with the app."""
    settings = settings or Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    settings.shared.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.sqlalchemy_url)
    prepare_schema(engine, settings.sqlalchemy_url)
    sessions = make_sessionmaker(engine)
    launcher = LocalLauncher(settings)
    supervisor = Supervisor(sessions, launcher, interval=settings.supervise_interval_s, grace=settings.stop_grace_s)
    host_sampler = HostSampler()  # NVML opened on the first look at the Host page, once for the app

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        supervisor.start()
        yield
        supervisor.stop()
        host_sampler.close()
        engine.dispose()

    app = FastAPI(
        title="Rankboard",
        version="0.1.0",
        lifespan=lifespan,
        description="Start, stop and watch PyTorch DDP training runs.",
    )
    app.state.settings, app.state.sessions, app.state.launcher = settings, sessions, launcher
    app.state.supervisor, app.state.templates = supervisor, make_templates()
    app.state.host_sampler = host_sampler
    app.state.run_fragments = SharedFragments()
    app.add_exception_handler(RankboardError, _error_response)  # type: ignore[arg-type]
    app.include_router(health.router)
    app.include_router(host_api.router)
    app.include_router(runs_api.router)
    app.include_router(charts_api.router)
    app.include_router(files_api.router)
    app.include_router(logs_pages.router)  # the run page's log panel and the logs API
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


def _error_response(request: Request, exc: RankboardError) -> Response:
    """Domain errors as JSON under /api (shaped like validation errors when a field is wrong), else as a page."""
    if request.url.path.startswith("/api"):
        if isinstance(exc, FieldInvalid):
            detail = [{"loc": ["body", exc.field], "msg": exc.message, "type": "value_error"}]
            return JSONResponse({"detail": detail}, status_code=exc.status_code)
        return JSONResponse({"detail": exc.message}, status_code=exc.status_code)
    return pages.error_page(request, exc)
