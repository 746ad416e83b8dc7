"""Alerts to a real HTTP receiver on 127.0.0.1: a run that fails (a real torchrun of a script that raises) alerts
once per webhook, Slack's body and the generic one; a receiver that is down gets bounded retries, then the delivery
is failed; meanwhile the API answers."""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rankboard import wire

from app.auth.passwords import sha256 as hash_token
from app.core.models import Run, RunStatus, utcnow
from app.core.settings import Settings
from app.launcher import processes
from app.main import create_app
from tests.app.conftest import TOKEN, post
from tests.live import free_port, wait_for

FAILING = "import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n"


class Receiver:
    """A webhook receiver: keeps every POST (path, JSON body) it gets; answers 200, or a redirect to `redirect`."""

    def __init__(self, redirect: str | None = None) -> None:
        self.got: list[tuple[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                receiver.got.append((self.path, json.loads(self.rfile.read(length))))
                self.send_response(200 if redirect is None else 307)
                if redirect is not None:
                    self.send_header("Location", redirect)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.close()


def start_failing_run(client: TestClient, name: str) -> int:
    """A run of a script that exits 3, launched by the server (a real torchrun); returns once it is failed."""
    run_id = int(client.post("/api/runs", json={"name": name, "script": "fails.py", "nproc_per_node": 1}).json()["id"])
    wait_for(lambda: client.get(f"/api/runs/{run_id}").json()["status"] == "failed", 120, what="the run to fail")
    return run_id


def make_app(root: Path, webhooks: list[dict[str, Any]], **extra: Any) -> TestClient:
    options = {"supervise_interval_s": 0.2, "slots": 2, "alert_disk_free_percent": 0, **extra}
    settings = Settings(data_dir=root / "data", shared_dir=root / "shared", alert_webhooks=webhooks, **options)
    (root / "shared").mkdir(parents=True, exist_ok=True)
    (root / "shared" / "fails.py").write_text(FAILING)
    return TestClient(create_app(settings))


def test_a_failed_run_alerts_once_per_webhook_with_each_body(tmp_path: Path, receiver: Receiver) -> None:
    hooks = [
        {"url": f"{receiver.url}/slack/T000/SECRET", "format": "slack", "events": ["failed"]},
        {"url": f"{receiver.url}/generic", "format": "json", "events": ["failed", "lost", "succeeded"]},
    ]
    with make_app(tmp_path, hooks) as client:
        run_id = start_failing_run(client, "doomed")
        wait_for(lambda: len(receiver.got) >= 2, 30, what="two deliveries")
        time.sleep(1.5)  # several more ticks: the failure is still there, and must not alert again
        deliveries = client.get(f"/api/runs/{run_id}/alerts").json()
        page = client.get(f"/runs/{run_id}").text
    assert sorted(path for path, _ in receiver.got) == ["/generic", "/slack/T000/SECRET"]
    bodies = dict(receiver.got)
    slack = bodies["/slack/T000/SECRET"]
    assert list(slack) == ["text"] and f"run {run_id} (doomed) failed: torchrun exited with" in slack["text"]
    assert f"/runs/{run_id}|open>" in slack["text"]
    generic = bodies["/generic"]
    assert (generic["condition"], generic["run"]["id"], generic["run"]["name"], generic["run"]["status"]) == (
        "failed", run_id, "doomed", "failed")  # fmt: skip
    assert generic["url"].endswith(f"/runs/{run_id}") and "torchrun exited with" in generic["message"]
    assert [(d["condition"], d["status"], d["attempts"], d["url_host"]) for d in deliveries] == [
        ("failed", "sent", 1, "127.0.0.1")] * 2  # fmt: skip
    assert all("SECRET" not in d["webhook"] for d in deliveries) and "SECRET" not in page
    assert page.count('class="delivery-sent"') == 2


def test_a_run_resumed_that_fails_again_alerts_again(tmp_path: Path, receiver: Receiver) -> None:
    with make_app(tmp_path, [{"url": f"{receiver.url}/hook", "events": ["failed"]}]) as client:
        run_id = start_failing_run(client, "twice")
        wait_for(lambda: len(receiver.got) == 1, 30, what="the first alert")
        assert client.post(f"/api/runs/{run_id}/resume").status_code == 202
        wait_for(lambda: client.get(f"/api/runs/{run_id}").json()["status"] != "failed", 30, what="the resume")
        wait_for(lambda: client.get(f"/api/runs/{run_id}").json()["status"] == "failed", 120, what="the 2nd failure")
        wait_for(lambda: len(receiver.got) == 2, 30, what="the second alert")
        time.sleep(1)
    assert [body["run"]["id"] for _, body in receiver.got] == [run_id, run_id]


def test_receivers_down_or_hung_get_retries_then_the_delivery_fails_and_the_api_answers_meanwhile(
    tmp_path: Path,
) -> None:
    down = f"http://127.0.0.1:{free_port()}/down"  # nothing listens there: refused at once
    hung = socket.create_server(("127.0.0.1", 0))  # takes connections into its backlog, never answers
    hooks = [
        {"url": down, "events": ["failed"], "name": "down"},
        {"url": f"http://127.0.0.1:{hung.getsockname()[1]}/hung", "events": ["failed"], "name": "hung"},
    ]
    with hung, make_app(tmp_path, hooks, alert_attempts=3, alert_backoff_s=0.2, alert_timeout_s=1) as client:
        run_id = start_failing_run(client, "unheard")
        seen: list[dict[str, tuple[str, int]]] = []

        def both_failed() -> bool:
            found = {
                d["webhook"]: (d["status"], d["attempts"]) for d in client.get(f"/api/runs/{run_id}/alerts").json()
            }
            seen.append(found)
            return len(found) == 2 and all(status == "failed" for status, _ in found.values())

        wait_for(both_failed, 30, interval=0.1, what="both deliveries to be marked failed")
        final = {d["webhook"]: d for d in client.get(f"/api/runs/{run_id}/alerts").json()}
    assert {name: d["attempts"] for name, d in final.items()} == {"down": 3, "hung": 3}
    assert "ConnectionRefusedError" in final["down"]["last_error"] and "timed out" in final["hung"]["last_error"]
    # The API answered while the hung receiver held the sender: it saw that delivery pending, between its tries.
    assert any(seen_now.get("hung", ("", 0))[0] == "pending" and seen_now["hung"][1] >= 1 for seen_now in seen)


def test_a_condition_that_holds_tick_after_tick_alerts_once(tmp_path: Path, receiver: Receiver) -> None:
    """The shared disk "nearly full" below 100% free: true on every tick, so only de-duplication keeps it to one."""
    hooks = [{"url": f"{receiver.url}/disk", "events": ["disk_low"]}]
    with make_app(tmp_path, hooks, alert_disk_free_percent=100) as client:
        wait_for(lambda: receiver.got, 30, what="the disk alert")
        time.sleep(1.5)  # several more ticks of 0.2 s
        listed = client.get("/api/alerts").json()
    assert [(path, body["condition"], body["run"]) for path, body in receiver.got] == [("/disk", "disk_low", None)]
    assert "below 100%" in receiver.got[0][1]["message"]
    assert [(d["condition"], d["run_id"], d["status"]) for d in listed["deliveries"]] == [("disk_low", None, "sent")]
    assert [(w["host"], w["events"]) for w in listed["webhooks"]] == [("127.0.0.1", ["disk_low"])]


def test_a_redirect_is_never_followed(tmp_path: Path, receiver: Receiver) -> None:
    """A webhook that answers 307 elsewhere (here another port): the alert goes no further, and fails at once."""
    redirecting = Receiver(redirect=f"{receiver.url}/elsewhere")
    try:
        hooks = [{"url": f"{redirecting.url}/hook", "events": ["disk_low"]}]
        with make_app(tmp_path, hooks, alert_disk_free_percent=100) as client:
            statuses = lambda: [d["status"] for d in client.get("/api/alerts").json()["deliveries"]]  # noqa: E731
            wait_for(lambda: statuses() == ["failed"], 30, what="the delivery to fail")
            delivery = client.get("/api/alerts").json()["deliveries"][0]
    finally:
        redirecting.close()
    assert [path for path, _ in redirecting.got] == ["/hook"] and receiver.got == []
    assert delivery["attempts"] == 1 and delivery["http_status"] == 307 and "not followed" in delivery["last_error"]


def test_a_run_not_progressing_or_with_a_non_finite_loss_alerts_once_until_it_clears(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A running run (reported to by this process) with no step for longer than stall_after_s, then a loss of NaN,
    a finite one (cleared), and an infinite one (a new alert). The test ticks the supervisor itself, so that the run
    is never launched."""
    hooks = [{"url": f"{receiver.url}/hook", "events": ["not_progressing", "non_finite_loss"]}]
    with make_app(tmp_path, hooks, stall_after_s=1, supervise_interval_s=3600) as client:

        def tick() -> bool:
            client.app.state.supervisor.tick()  # type: ignore[attr-defined]
            return True

        run_id = int(client.post("/api/runs", json={"name": "quiet", "nproc_per_node": 1}).json()["id"])
        me = os.getpid()
        with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
            run = db.get(Run, run_id)
            run.status, run.token_hash, run.started_at = RunStatus.running, hash_token(TOKEN), utcnow()
            run.pid, run.pid_start_ticks = me, processes.start_ticks(me)
        wait_for(lambda: tick() and receiver.got, 30, what="the not-progressing alert")
        for step, loss in ((5, math.nan), (6, 0.5), (7, math.inf)):
            before = len(receiver.got)
            assert post(client, run_id, wire.Batch((wire.Point("loss", step, loss, 0, 1.7e9),)).to_json()).is_success
            if not math.isfinite(loss):
                wait_for(lambda: tick() and len(receiver.got) > before, 30, what=f"the alert of {loss}")  # noqa: B023
            for _ in range(5):  # a condition that still holds does not alert again
                tick()
                time.sleep(0.2)
    got = [(body["condition"], body["message"].partition(" has ")[2]) for _, body in receiver.got]
    assert got[0] == ("not_progressing", "") and "is not progressing: no report from the trainer" in (
        receiver.got[0][1]["message"])  # fmt: skip
    assert [g for g in got if g[0] == "non_finite_loss"] == [
        ("non_finite_loss", "a loss of nan"), ("non_finite_loss", "a loss of inf")]  # fmt: skip
