"""`create_app(settings)`: the whole server, built from one Settings object."""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from rankboard import wire
from starlette.exceptions import HTTPException

from app import __version__
from app.core.db import make_engine, make_sessionmaker, prepare_schema
from app.core.errors import FieldInvalid, FormInvalid, LoginThrottled, MethodNotAllowed, RankboardError
from app.core.folders import RunFolders
from app.core.settings import Settings
from app.launcher.launchers import Launchers
from app.launcher.local import LocalLauncher
from app.launcher.slurm import SlurmLauncher, slurm_available
from app.services import users
from app.services.alerts import AlertRules
from app.services.examples import offer_examples
from app.services.host import HostSampler
from app.services.ingest_totals import IngestTotals
from app.services.login_throttle import LoginThrottle
from app.web.api import alerts as alerts_api
from app.web.api import charts as charts_api
from app.web.api import comm as comm_api
from app.web.api import export as export_api
from app.web.api import files as files_api
from app.web.api import forensics as forensics_api
from app.web.api import goodput as goodput_api
from app.web.api import guarded, with_security
from app.web.api import host as host_api
from app.web.api import mfu as mfu_api
from app.web.api import preflight as preflight_api
from app.web.api import queue as queue_api
from app.web.api import runs as runs_api
from app.web.api import runs_table as runs_table_api
from app.web.api import server as server_api
from app.web.api import sweeps as sweeps_api
from app.web.api import usage as usage_api
from app.web.api import users as users_api
from app.web.guard import AuthSwitch, Guard
from app.web.pages import alerts as alerts_pages
from app.web.pages import docs as docs_pages
from app.web.pages import export as export_pages
from app.web.pages import files as files_pages
from app.web.pages import forensics as forensics_pages
from app.web.pages import host as host_pages
from app.web.pages import logs as logs_pages
from app.web.pages import queue as queue_pages
from app.web.pages import runs as runs_pages
from app.web.pages import runs_table as runs_table_pages
from app.web.pages import sweeps as sweeps_pages
from app.web.pages import usage as usage_pages
from app.web.pages import users as users_pages
from app.web.stream import SharedFragments
from app.web.templating import make_templates
from app.workers.alert_sender import AlertSender
from app.workers.ingest_threads import IngestThreads
from app.workers.ingest_totals import IngestTotalsWriter
from app.workers.ingest_writer import IngestWriter
from app.workers.lease import SUPERVISOR as SUPERVISOR_LEASE
from app.workers.lease import Lease
from app.workers.supervisor import LEASE_TICKS, Supervisor

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app, its database migrated or refused (SchemaMismatch), its supervisor started with the app."""
    settings = settings or Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    settings.shared.mkdir(parents=True, exist_ok=True)
    offer_examples(settings.shared)
    engine = make_engine(settings.sqlalchemy_url)
    prepare_schema(engine, settings.sqlalchemy_url)
    sessions = make_sessionmaker(engine)
    folders = RunFolders(settings.shared)
    launcher = LocalLauncher(settings, folders)
    offer_slurm = settings.launcher == "slurm" or (settings.launcher == "auto" and slurm_available())
    launchers = Launchers(launcher, SlurmLauncher(settings, folders) if offer_slurm else None)
    alerting = bool(settings.alert_webhooks)
    # Of several server processes on one database, only the lease's holder supervises and sends alerts.
    lease = Lease(sessions, name=SUPERVISOR_LEASE, ttl_s=settings.supervise_interval_s * LEASE_TICKS)
    supervisor = Supervisor(
        sessions, launchers, folders, interval=settings.supervise_interval_s, grace=settings.stop_grace_s,
        stall_after=settings.stall_after_s,
        alert_rules=AlertRules.from_settings(settings) if alerting else None,
        alert_sender=AlertSender(sessions, settings, lease=lease) if alerting else None, lease=lease,
    )  # fmt: skip
    ingest_totals = IngestTotals()
    ingest_totals_writer = IngestTotalsWriter(sessions, ingest_totals)
    ingest_threads = IngestThreads(settings.ingest_nice)
    ingest_writer = IngestWriter(sessions, nice=settings.ingest_nice, counters=ingest_totals)
    host_sampler = HostSampler()  # NVML opened on the first look at the Host page, once for the app
    with sessions() as db:
        users.ensure_first_admin(db, settings=settings)
    switch = AuthSwitch(sessions, settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        supervisor.start()
        ingest_totals_writer.start()
        yield
        supervisor.stop()
        ingest_totals_writer.stop()
        host_sampler.close()
        ingest_threads.close()
        ingest_writer.close()  # after the parsing threads: a batch parsed at the end is still stored
        engine.dispose()

    app = FastAPI(
        title="Rankboard",
        version=__version__,
        lifespan=lifespan,
        description="Start, stop and watch PyTorch DDP training runs.",
        docs_url=None,  # FastAPI's own /docs and /redoc load their scripts from a CDN: the pages serve /docs locally
        redoc_url=None,
    )
    app.state.settings, app.state.sessions, app.state.launcher = settings, sessions, launcher
    app.state.folders, app.state.launchers = folders, launchers
    app.state.supervisor, app.state.templates = supervisor, make_templates()
    app.state.host_sampler = host_sampler
    app.state.run_fragments = SharedFragments()
    app.state.ingest_counters = ingest_totals  # counted here, added to the database's totals for /metrics
    app.state.ingest_threads, app.state.ingest_writer = ingest_threads, ingest_writer
    app.state.auth = switch
    app.state.login_throttle = LoginThrottle(limit=settings.login_attempts, window_s=settings.login_window_s)
    app.add_middleware(Guard, settings=settings, sessions=sessions, switch=switch, refuse=_error_response)
    app.add_exception_handler(RankboardError, _error_response)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    _include_routes(app, prometheus=settings.prometheus)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_exception_handler(405, _method_not_allowed)  # type: ignore[arg-type]
    document = app.openapi
    app.openapi = lambda: app.openapi_schema or with_security(document())  # type: ignore[method-assign]
    return app


def _include_routes(app: FastAPI, *, prometheus: bool) -> None:
    """The API's routers and the pages', each by its subject; the API documents what the guard may answer first."""
    app.include_router(server_api.router)
    for subject in (host_api, runs_api, runs_table_api, forensics_api, goodput_api, comm_api, preflight_api, mfu_api,
                    sweeps_api, charts_api, files_api, export_api, queue_api, usage_api):  # fmt: skip
        app.include_router(subject.router, responses=guarded())
    app.include_router(logs_pages.router, responses=guarded())  # the run page's log panel and the logs API
    app.include_router(users_api.router, responses=guarded())
    app.include_router(alerts_api.router, responses=guarded())
    if prometheus:  # imported only then: prometheus_client is a tenth of an idle server's memory (issue 43)
        from app.web.api import exposition as exposition_api

        app.include_router(exposition_api.router, responses=guarded())
    for pages in (users_pages, alerts_pages, runs_table_pages, runs_pages, forensics_pages, sweeps_pages, host_pages,
                  files_pages, docs_pages, export_pages, queue_pages, usage_pages):  # fmt: skip
        app.include_router(pages.router)


def _error_response(request: Request, exc: RankboardError) -> Response:
    """Domain errors as JSON under /api (a 422 shaped like FastAPI's validation errors, naming the field and where it
    was: path, query, header or body), else as a page."""
    if not request.url.path.startswith("/api"):
        return runs_pages.error_page(request, exc)
    if isinstance(exc, LoginThrottled):
        return JSONResponse({"detail": exc.message}, exc.status_code, headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, FieldInvalid):
        errors = {exc.field: exc.message}
    elif isinstance(exc, FormInvalid):
        errors = exc.errors
    else:
        return JSONResponse({"detail": exc.message}, status_code=exc.status_code)
    detail = [{"loc": [_location(request, field), field], "msg": message, "type": "value_error"}
              for field, message in errors.items()]  # fmt: skip
    return JSONResponse({"detail": detail}, status_code=exc.status_code)


def _location(request: Request, field: str) -> str:
    """Where the request carried a field: a parameter of the route's, by its name, or else the body."""
    route = request.scope.get("route")
    if isinstance(route, APIRoute):
        for location, params in (("path", route.dependant.path_params), ("query", route.dependant.query_params),
                                 ("header", route.dependant.header_params)):  # fmt: skip
            if any(param.alias == field for param in params):
                return location
    return "body"


async def _invalid_request(request: Request, exc: RequestValidationError) -> Response:
    """FastAPI's 422 under /api; on a page, the error page naming the first wrong parameter. A path that is another
    route's own (PATCH /api/runs/bulk, taken by PATCH /api/runs/{run_id} as a run id) is that route's: 405."""
    allowed = _methods(request)
    if any(error["loc"][0] == "path" for error in exc.errors()) and _literal_route(request) and allowed:
        return _method_not_allowed(request, HTTPException(405))
    if request.url.path.startswith("/api"):
        return JSONResponse({"detail": _json_safe(jsonable_encoder(exc.errors()))}, status_code=422)
    error = exc.errors()[0]
    field = next((str(part) for part in reversed(error["loc"]) if isinstance(part, str)), "request")
    return runs_pages.error_page(request, FieldInvalid(field, f"{field}: {error['msg']}"))


def _json_safe(value: Any) -> Any:
    """An error quotes the input it refused, which may be NaN or 1e400: JSON has no such numbers, so they are quoted
    as the strings the ingest format uses ("NaN", "Infinity"), instead of failing the reply with a 500."""
    if isinstance(value, float):
        return wire.encode_value(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value


def _method_not_allowed(request: Request, exc: HTTPException) -> Response:
    """A 405 whose Allow lists every method of the path: Starlette names those of the first route that matched it
    only, though GET, PATCH and DELETE of /api/runs/{id} are three routes."""
    allow = ", ".join(sorted(_methods(request) or (exc.headers or {}).get("Allow", "").split(", ")))
    response = _error_response(request, MethodNotAllowed(f"{request.method} is not allowed here; allowed: {allow}"))
    response.headers["Allow"] = allow
    return response


def _methods(request: Request) -> set[str]:
    """Every method the API documents at the request's path (HEAD with GET, as Starlette answers it): a path that
    is documented as it is (/api/runs/bulk) is that one's, not also a template's that takes it (/api/runs/{id})."""
    paths, path = request.app.openapi()["paths"], request.url.path
    fits = [path] if path in paths else [template for template in paths if _template(template).fullmatch(path)]
    found = {method.upper() for template in fits for method in paths[template]}
    return found | ({"HEAD"} if "GET" in found else set())


@functools.cache
def _template(path: str) -> re.Pattern[str]:
    """A documented path as a pattern: {name} takes one segment, {name:path} the rest."""
    parts = re.split(r"(\{[^}]+\})", path)
    segment = {True: ".+", False: "[^/]+"}
    return re.compile("".join(segment[part.endswith(":path}")] if part.startswith("{") else re.escape(part)
                              for part in parts))  # fmt: skip


def _literal_route(request: Request) -> bool:
    """Whether a documented path, without parameters, is the request's."""
    return request.url.path in request.app.openapi()["paths"]
