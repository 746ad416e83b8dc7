"""The queue end to end: a real server with users, real torchruns (gloo) on its two CPU slots. A user over her limit
waits with the reason shown in the API, on the queue page (headless Chromium) and by `rankboard queue`, while the
others' runs go on; an operator raises a run's priority from the page and it moves up; when her other run ends, her
limit no longer holds her run, and its reason says so. (Preemption, with a checkpoint and an exact resume, is
tests/e2e/test_recovery.py's.)"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from app.core.db import make_engine, make_sessionmaker
from app.core.models import Role
from app.launcher import processes
from app.services import tokens, users
from tests.e2e.runs import FINAL, wait_status
from tests.live import REPO, LiveServer, run_processes, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
ADMIN_PASSWORD = "queue-admin-pw"
PASSWORDS = {"ada": "ada-password", "bo": "bo-password"}
# Runs until stopped; not preemptible, so that a raised priority waits for room here rather than stopping one.
LONG = {"workload": "mlp", "epochs": 50, "batch_size": 32, "nproc_per_node": 1, "preemptible": False}
OVER = "waiting: ada runs 1 of 1 run allowed at once"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("queue")
    live = LiveServer(root, RANKBOARD_STOP_GRACE_S="30", RANKBOARD_SLOTS="2", RANKBOARD_ADMIN_PASSWORD=ADMIN_PASSWORD)
    live.start()
    yield live
    live.stop()
    processes.kill_all(run_processes(root))


@pytest.fixture(scope="module")
def bearer(server: LiveServer) -> dict[str, str]:
    """ada and bo (operators) and a token each; the admin's token."""
    engine = make_engine(f"sqlite:///{server.root / 'data' / 'rankboard.db'}")
    try:
        with make_sessionmaker(engine)() as db:
            for name, password in PASSWORDS.items():
                users.add_user(db, name=name, role=Role.operator, password=password, actor="test")
            roles = {"admin": Role.admin, "ada": Role.operator, "bo": Role.operator}
            return {name: tokens.create_token(db, name=f"t-{name}", role=role, expires="1d", owner=name,
                                              actor="test").secret for name, role in roles.items()}  # fmt: skip
    finally:
        engine.dispose()


def api(server: LiveServer, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=10, headers={"Authorization": f"Bearer {token}"})


def create(client: httpx.Client, name: str) -> int:
    answer = client.post("/api/runs", json={"name": name, **LONG})
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def reason_is(client: httpx.Client, run_id: int, reason: str) -> dict[str, Any] | None:
    run = client.get(f"/api/runs/{run_id}").json()
    return run if run["status_reason"] == reason else None


def test_a_user_over_her_limit_waits_saying_so_and_the_page_reorders_by_priority(
    server: LiveServer, bearer: dict[str, str], page: Page
) -> None:
    with api(server, bearer["admin"]) as admin, api(server, bearer["ada"]) as ada, api(server, bearer["bo"]) as bo:
        assert admin.put("/api/queue/limits/users/ada", json={"max_runs": 1}).is_success
        first = create(ada, "ada's first")
        wait_status(ada, first, {"running"}, timeout=90)
        second = create(ada, "ada's second")
        others = create(bo, "bo's")
        wait_status(bo, others, {"running"}, timeout=90)  # her limit holds up no one else
        wait_for(lambda: reason_is(ada, second, OVER), 30, what="the limit's reason")
        later = create(bo, "bo's later")  # no slot free: it waits behind her run, which a limit holds

        page.goto(f"{server.url}/login?next=/queue")
        page.get_by_label("User").fill("bo")
        page.get_by_label("Password").fill(PASSWORDS["bo"])
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("heading", name="Queue")).to_be_visible()
        expect(page.locator(f"#queued-{second} .waits-for")).to_have_text(OVER)
        expect(page.locator(f"#queued-{later} .waits-for")).to_have_text("waiting for 1 CPU slot: 0 free")
        expect(page.locator(f"#queued-{later}")).to_have_attribute("data-position", "2")
        expect(page.locator(f"#holding-{first}")).to_contain_text("ada")
        page.get_by_label("Priority of run").fill(str(later))
        page.get_by_label("to", exact=True).fill("high")
        page.get_by_role("button", name="Set", exact=True).click()
        expect(page.locator(f"#queued-{later}")).to_have_attribute("data-position", "1")
        expect(page.locator(f"#queued-{later} .priority")).to_have_text("high")

        shown = subprocess.run([sys.executable, "-m", "app.cli", "queue", "--url", server.url, "--token",
                                bearer["ada"]], cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert OVER in shown.stdout and "0 of 2 CPU slots free" in shown.stdout

        ada.post(f"/api/runs/{first}/stop")
        wait_status(ada, first, FINAL, timeout=90)
        wait_status(bo, later, {"starting", "running"}, timeout=60)  # the higher priority takes the slot
        # Her limit no longer holds her run: it waits for room now, and says so.
        assert wait_for(lambda: reason_is(ada, second, "waiting for free process slots"), 30, what="the new reason")
        expect(page.locator(f"#queued-{second} .waits-for")).to_have_text("waiting for 1 CPU slot: 0 free")


def cli(server: LiveServer, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`rankboard queue ...` as a user types it, against the live server."""
    return subprocess.run([sys.executable, "-m", "app.cli", "queue", *args, "--url", server.url, "--token", token],
                          cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_limits_groups_and_priorities_from_the_command_line(server: LiveServer, bearer: dict[str, str]) -> None:
    assert cli(server, bearer["admin"], "limit", "*", "--slots", "2", "--runs", "3").returncode == 0
    assert cli(server, bearer["admin"], "group", "vision", "--members", "ada, bo", "--slots", "2").returncode == 0
    shown = cli(server, bearer["admin"], "limits")
    assert shown.returncode == 0, shown.stderr
    lines = [line.split() for line in shown.stdout.splitlines()]
    assert ["*", "2", "3"] in lines and ["vision", "ada,", "bo", "2", "any"] in lines
    refused = cli(server, bearer["ada"], "limit", "ada", "--slots", "8")
    assert refused.returncode == 1 and "has the role operator" in refused.stderr
    with api(server, bearer["ada"]) as ada:
        waiting = ada.post("/api/runs", json={"name": "to reorder", **LONG, "nproc_per_node": 2}).json()["id"]
        changed = cli(server, bearer["ada"], "priority", str(waiting), "low")
        assert changed.returncode == 0 and changed.stdout.strip() == f"run {waiting} to reorder: priority -100"
        too_high = cli(server, bearer["ada"], "priority", str(waiting), "1000")
        assert too_high.returncode == 1 and "1000 needs an admin" in too_high.stderr
        ada.post(f"/api/runs/{waiting}/stop")
    assert cli(server, bearer["admin"], "group", "vision", "--remove").returncode == 0
    assert cli(server, bearer["admin"], "limit", "*", "--remove", "--json").stdout.startswith('{"unit": "CPU slots"')
