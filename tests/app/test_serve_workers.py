"""`rankboard serve --workers 2` on PostgreSQL, as real processes on one port: posts taken by both workers are each
stored once (retries of one batch at once included), a page's live stream gets points whichever worker took them,
exactly one worker holds the supervisor's lease and another takes it when that one dies; on SQLite it is refused."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from rankboard import wire
from rankboard.report import IngestConnection

from app.core.models import utcnow
from app.launcher.local import LAUNCH_MARKER, LAUNCHER_LOG
from app.store import leases
from app.workers.lease import SUPERVISOR
from tests.live import REPO, LiveServer, open_run, points, server_db, server_sent_events, wait_for
from tests.postgres import new_database, postgres_bin, postgres_server

TOKEN = "workers-t0ken"
FINAL = ("succeeded", "failed", "stopped", "lost")
INTERVAL_S = 0.2  # the supervisor's tick; its lease lasts LEASE_TICKS of them
needs_postgres = pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL is not installed (scripts/test does)")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (scripts/test installs it)")
    with postgres_server() as dsn:
        url = new_database(dsn)
        slots = "4"  # the runs the tests open hold a slot each, and one more is launched
        live = LiveServer(tmp_path_factory.mktemp("workers"), RANKBOARD_DATABASE_URL=url, RANKBOARD_WORKERS="2",
                          RANKBOARD_SUPERVISE_INTERVAL_S=str(INTERVAL_S), RANKBOARD_SLOTS=slots)  # fmt: skip
        live.start()
        try:
            wait_for(lambda: both_serving(live), timeout=60, what="both workers serving")
            yield live
        finally:
            live.stop()


def workers(server: LiveServer) -> list[psutil.Process]:
    """The server's worker processes: uvicorn's manager's children that listen on its port."""
    assert server.process is not None
    return [child for child in psutil.Process(server.process.pid).children()
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == server.port
                   for c in child.net_connections("tcp"))]  # fmt: skip


def both_serving(server: LiveServer) -> bool:
    """Whether each worker has answered: a worker listens from its start (the socket is inherited), but accepts
    only once its app is built."""
    seen = set()
    for _ in range(20):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.request("GET", "/api/health")
        connection.getresponse().read()
        seen.add(worker_of(server, connection.sock.getsockname()[1]))
        connection.close()
    return len(seen - {None}) == 2


def worker_of(server: LiveServer, client_port: int) -> int | None:
    """The pid of the worker that accepted the connection this machine opened from `client_port`."""
    for worker in workers(server):
        if any(c.raddr and c.raddr.port == client_port for c in worker.net_connections("tcp")):
            return worker.pid
    return None


def client_port(connection: IngestConnection) -> int:
    """The local port of the client's kept-alive connection (opened by its first post)."""
    assert connection._connection is not None and connection._connection.sock is not None
    return int(connection._connection.sock.getsockname()[1])


def body(steps: range) -> bytes:
    return json.dumps(
        wire.Batch(tuple(wire.Point("loss", s, 1.0 / (s + 1), 0, 1.7e9 + s) for s in steps)).to_json()
    ).encode()


def lease_holder(server: LiveServer) -> str | None:
    with server_db(server) as db:
        return leases.holder_of(db, name=SUPERVISOR, now=utcnow())


@needs_postgres
def test_posts_to_both_workers_and_retries_at_once_store_every_point_once(server: LiveServer) -> None:
    run_id = open_run(server, TOKEN)
    batches = [range(first, first + 50) for first in range(0, 2000, 50)]
    sends = [steps for steps in batches for _ in range(3)]  # each batch posted three times, by three threads at once
    took_by: set[int] = set()

    def send(steps: range) -> dict[str, int]:
        connection = IngestConnection(server.url, str(run_id), TOKEN)  # a connection each: any worker may accept it
        status, line, reply = connection.post(body(steps))
        assert status == 200, line
        took_by.add(worker_of(server, client_port(connection)) or 0)
        connection.close()
        return json.loads(reply)  # type: ignore[no-any-return]

    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(send, sends))
    with server.api() as api:
        stored = [p["step"] for p in points(api, run_id, "loss")]
    assert stored == list(range(2000)), "every point once, none lost, none twice"
    assert sum(reply["stored"] for reply in replies) == 2000, "and each was new to the store in one reply only"
    assert len(took_by - {0}) == 2, "both workers took posts"


@needs_postgres
def test_a_live_stream_gets_points_whichever_worker_took_them(server: LiveServer) -> None:
    run_id = open_run(server, TOKEN)
    page = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    page.request("GET", f"/runs/{run_id}/stream")
    stream = page.getresponse()
    assert stream.status == 200
    page_worker = worker_of(server, page.sock.getsockname()[1])
    posted, posted_by = set(), set()
    for first in range(0, 5000, 10):  # a new connection each, until the other worker has taken some
        connection = IngestConnection(server.url, str(run_id), TOKEN)
        status, line, _ = connection.post(body(range(first, first + 10)))
        assert status == 200, line
        posted.update(range(first, first + 10))
        posted_by.add(worker_of(server, client_port(connection)))
        connection.close()
        if len(posted_by - {page_worker}) >= 1 and len(posted) >= 100:
            break
    assert posted_by - {page_worker}, "some posts went to the worker that does not serve the page"
    received: set[int] = set()
    lines = (line.decode().rstrip("\n") for line in iter(stream.fp.readline, b""))
    for _id, event, data in server_sent_events(lines):  # the socket's 30 s timeout fails the test if none come
        if event == "points":
            for series in json.loads(data)["series"].values():
                received.update(series["steps"])
        if posted <= received:
            break
    assert posted <= received, "the stream ended before every point came"
    page.close()


@needs_postgres
def test_a_queued_run_is_started_once_by_the_one_supervising_worker(server: LiveServer) -> None:
    (server.root / "shared" / "quick.py").write_text("print('done')\n")
    with server.api() as api:
        run = api.post("/api/runs", json={"script": "quick.py", "nproc_per_node": 1}).json()
        status = wait_for(lambda: (s := api.get(f"/api/runs/{run['id']}").json()["status"]) in FINAL and s,
                          timeout=120, what="the run to end")  # fmt: skip
    assert status == "succeeded"
    launcher_log = (server.root / "shared" / "logs" / f"run-{run['id']}" / LAUNCHER_LOG).read_text()
    assert launcher_log.count(LAUNCH_MARKER) == 1, "launched once, though two workers tick on one database"


@needs_postgres
def test_one_worker_holds_the_supervisors_lease_and_another_takes_it_when_that_one_dies(server: LiveServer) -> None:
    pids = {worker.pid for worker in workers(server)}
    holder = wait_for(lambda: lease_holder(server), timeout=30, what="a lease holder")
    holder_pid = int(holder.split(":")[1])
    assert holder_pid in pids, "a worker holds it, and by the row's key only one can"
    os.kill(holder_pid, signal.SIGKILL)  # no release: the lease must expire
    new = wait_for(lambda: (h := lease_holder(server)) and h != holder and h, timeout=30, what="another holder")
    new_pid = int(new.split(":")[1])
    assert new_pid != holder_pid and psutil.pid_exists(new_pid)
    wait_for(lambda: len(workers(server)) == 2, timeout=60, what="uvicorn to replace the dead worker")


def test_more_than_one_worker_on_sqlite_is_refused_naming_the_option(tmp_path: Path) -> None:
    env = {**os.environ, "RANKBOARD_DATA_DIR": str(tmp_path / "data"), "RANKBOARD_SHARED_DIR": str(tmp_path / "s")}
    env.pop("RANKBOARD_DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--workers", "2"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "--workers 2" in done.stderr and "PostgreSQL" in done.stderr and "SQLite takes one writer" in done.stderr
    assert not (tmp_path / "data" / "rankboard.db").exists(), "refused before anything was made"
