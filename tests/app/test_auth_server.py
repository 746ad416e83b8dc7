"""Authentication as an administrator meets it in a shell: the real `rankboard` command refuses to serve beyond
loopback with no user, adds users and tokens, and turns authentication on for a server that is already running;
no password, token or session id is ever written in clear to the database or the server's log; an existing
database upgrades to the schema with users, its runs intact."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from alembic.command import upgrade as upgrade_to
from sqlalchemy import text

from app.core.db import alembic_config, make_engine, upgrade
from app.core.settings import Settings
from app.main import create_app
from tests.live import REPO, LiveServer


def rankboard(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The real command line, on `root`'s data and shared folders, with no password in the environment."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RANKBOARD_")}
    environment |= {"RANKBOARD_DATA_DIR": str(root / "data"), "RANKBOARD_SHARED_DIR": str(root / "shared"), **env}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=REPO, env=environment, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip


def test_serving_beyond_loopback_without_a_user_is_refused_naming_the_setting(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "::", "10.0.0.5"):
        refused = rankboard(tmp_path, "serve", "--host", host, "--port", "1")
        assert refused.returncode == 2, refused
        assert f"refusing to listen on {host}" in refused.stderr
        assert "RANKBOARD_ADMIN_PASSWORD" in refused.stderr and "rankboard users add" in refused.stderr
        assert "Rankboard on" not in refused.stdout


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path)
    yield live
    live.stop()


def test_users_and_tokens_from_the_command_line_turn_authentication_on(server: LiveServer) -> None:
    server.start()
    with server.api() as api:
        assert api.get("/api/runs").status_code == 200  # no user yet: open, on loopback
        added = rankboard(server.root, "users", "add", "ada", "--role", "admin")
        assert added.returncode == 0, added.stderr
        password = re.search(r"password, shown only this once: (\S+)", added.stdout)
        assert password is not None
        deadline = time.monotonic() + 10  # the running server looks again within a second
        while api.get("/api/runs").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert api.get("/api/runs").status_code == 401
        made = rankboard(server.root, "tokens", "create", "--name", "ci", "--role", "operator", "--expires", "90d")
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip().splitlines()[-1]
        assert token.startswith("rbt_")
        bearer = {"Authorization": f"Bearer {token}"}
        created = api.post("/api/runs", json={"name": "by ci"}, headers=bearer)
        assert created.status_code == 201 and created.json()["created_by"] == "token ci"
        listed = rankboard(server.root, "tokens", "list")
        assert "ci  operator" in listed.stdout and "last used" in listed.stdout and token not in listed.stdout
        assert re.fullmatch(
            r"ada  admin  added \d{4}-\d\d-\d\d \d\d:\d\d UTC\n", rankboard(server.root, "users", "list").stdout
        )
        browser = httpx.Client(base_url=server.url, follow_redirects=True)
        login = browser.post("/login", data={"name": "ada", "password": password[1]})
        assert login.status_code == 200 and "<h1>Runs</h1>" in login.text  # followed the redirect, logged in
        session_id = browser.cookies["rankboard_session"]
        assert browser.get("/api/me").json()["name"] == "ada"
        revoked = rankboard(server.root, "tokens", "revoke", "1")
        assert revoked.returncode == 0 and api.get("/api/runs", headers=bearer).status_code == 401
        last_admin = rankboard(server.root, "users", "remove", "ada")
        assert last_admin.returncode == 1 and "last admin" in last_admin.stderr
    server.stop()
    for secret in (password[1], token, session_id):
        stored = b"".join(path.read_bytes() for path in (server.root / "data").glob("rankboard.db*"))
        assert secret.encode() not in stored
        assert secret not in (server.root / "server.log").read_text()


def test_a_first_admin_from_the_environment(tmp_path: Path) -> None:
    server = LiveServer(tmp_path, RANKBOARD_ADMIN_PASSWORD="first-admin-pw")
    server.start()
    try:
        with httpx.Client(base_url=server.url, follow_redirects=True) as browser:
            assert browser.get("/api/runs").status_code == 401
            page = browser.get("/runs/new", headers={"Accept": "text/html"})  # to log in, then back
            assert page.url.path == "/login" and 'value="/runs/new"' in page.text
            back = browser.post("/login", data={"name": "admin", "password": "first-admin-pw", "next": "/runs/new"})
            assert back.url.path == "/runs/new" and "Start run" in back.text
    finally:
        server.stop()
    assert "first-admin-pw" not in (tmp_path / "server.log").read_text()


def test_an_existing_database_upgrades_with_its_runs_intact(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'rankboard.db'}"
    (tmp_path / "data").mkdir()
    upgrade_to(alembic_config(url), "0008")
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO runs (name, status, status_reason, created_at, workload, nproc_per_node, epochs, batch_size,"
            " lr, checkpoint_every, seed, epoch, step, total_steps, samples_per_s, trainer_finished, keep_last,"
            " keep_best, best_metric, init_optimizer, optimizer, lr_schedule, warmup_steps, weight_decay, grad_clip,"
            " grad_accum, precision, sync_batchnorm, find_unused_parameters, bucket_cap_mb, gradient_as_bucket_view,"
            " val_every, checkpoint_unit, max_restarts, pg_timeout_s, restarts)"
            " VALUES ('before auth', 'succeeded', 'training finished', '2026-01-01 00:00:00', 'mlp', 2, 1, 64, 0.001,"
            " 1, 0, 1, 10, 10, 0, 1, 0, 0, 'loss', 0, 'adamw', 'constant', 0, 0, 0, 1, 'off', 0, 0, 25, 0, 0,"
            " 'epoch', 0, 60, 0)"
        ))  # fmt: skip
        connection.execute(text("INSERT INTO run_events (run_id, at, status, reason) VALUES "
                                "(1, '2026-01-01 00:00:00', 'succeeded', 'training finished')"))  # fmt: skip
    engine.dispose()
    upgrade(url)
    settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared", supervise_interval_s=3600)
    from fastapi.testclient import TestClient

    with TestClient(create_app(settings)) as client:
        run = client.get("/api/runs/1").json()
        assert (run["name"], run["status"], run["step"]) == ("before auth", "succeeded", 10)
        assert run["created_by"] is None and run["audit"] == [] and len(run["events"]) == 1
        assert "before auth" in client.get("/runs/1").text
