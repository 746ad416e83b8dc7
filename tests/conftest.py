"""Fixtures that build real things: a migrated SQLite file, the app, a live server on a free port."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.core.db import upgrade
from app.core.settings import Settings
from app.launcher.local import visible_gpus
from app.main import create_app
from tests.live import LiveServer, serving

# FastAPI's TestClient sends `Host: testserver`; the server answers only to the names it is told (app.web.guard).
os.environ.setdefault("RANKBOARD_ALLOWED_HOSTS", "testserver")
# The suite is the CPU suite (gloo), on a GPU node too: there two ranks of a test's run would share one GPU, which
# NCCL refuses ("Duplicate GPU detected"). Hidden from the session, no server hands out a GPU nor trainer sees one.
if visible_gpus(os.environ):
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
# SIGTERM ends a session as Ctrl-C does, its fixtures torn down (servers stopped, trainers killed): scripts/test stops
# its background pytest so, which Ctrl-C does not reach.
signal.signal(signal.SIGTERM, signal.default_int_handler)


@pytest.fixture(scope="session")
def migrated_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file built by the migrations, once: each test's app starts on a copy of it, as a server restarts on
    its file (running every migration for each test took 0.2 of its 0.27 s of set-up). tests/app/test_db.py runs
    them on fresh files, as a first start does."""
    path = tmp_path_factory.mktemp("migrated") / "rankboard.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def settings(tmp_path: Path, migrated_database: Path) -> Settings:
    """Settings on a fresh data folder holding a migrated database; the supervisor ticks once at start (before the app
    answers) and then sleeps, so nothing launches."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copyfile(migrated_database, data / "rankboard.db")
    return Settings(data_dir=data, shared_dir=tmp_path / "shared", supervise_interval_s=3600, slots=2)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    with serving(tmp_path, RANKBOARD_STOP_GRACE_S="30", RANKBOARD_SLOTS="2") as server:  # the same on any host
        yield server
