"""A real `rankboard serve` in a subprocess, for the end-to-end tests and the benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
from rankboard import wire
from sqlalchemy import update
from sqlalchemy.orm import Session

from app.auth.passwords import sha256 as hash_token
from app.core.db import make_engine
from app.core.models import Run, RunStatus, utcnow
from app.launcher import processes
from app.schemas.runs import RunCreate
from app.services.lifecycle import transitions

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")
# What a rank prints when it aborts in torch's gloo teardown after its work is done, rarely (the DDP checklist); gdb
# on a core: a gloo worker thread frees a collective's tensor during interpreter shutdown and dies taking the GIL.
KNOWN_EXIT_ABORT = "terminate called without an active exception"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """`rankboard serve` in a subprocess, as a user starts it; restartable on the same data."""

    def __init__(self, root: Path, **env: str) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "RANKBOARD_DATA_DIR": str(root / "data"),
            "RANKBOARD_SHARED_DIR": str(root / "shared"),
            "RANKBOARD_PORT": str(self.port),
            "RANKBOARD_SUPERVISE_INTERVAL_S": "0.2",
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve"], cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/api/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError("server did not answer within 60 s")

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)
        self.process = None

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10)


@contextlib.contextmanager
def serving(root: Path, **env: str) -> Iterator[LiveServer]:
    """A started LiveServer on `root`; afterwards stopped, and every process of its runs killed, so that a failed
    test leaves no trainer behind."""
    server = LiveServer(root, **env)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        processes.kill_all(run_processes(root))


def open_run(server: LiveServer, token: str, status: str = "running") -> int:
    """A run that takes metrics with `token`, as the launcher leaves one once torchrun is up, without torchrun:
    the process reporting to it is this one, so its pid is the run's (a restarted server then finds it alive).

    (The launch itself, which makes the token, is tested end to end with a real torchrun.) One process, so that it
    fits any host, a one-GPU node included. Written whole in one transaction: a run created through the API is
    queued, and the supervisor's next tick may start its torchrun (it did, 50 ms after, once in 25 runs opened)
    before the run could be changed into this one, leaving a 10-epoch training beside the test.
    """
    me = os.getpid()
    spec = RunCreate(name="client", nproc_per_node=1)
    with server_db(server) as db:
        run = Run(**spec.model_dump(exclude={"allow_low_disk"}), token_hash=hash_token(token), pid=me,
                  pid_start_ticks=processes.start_ticks(me), started_at=utcnow())  # fmt: skip
        db.add(run)
        transitions.move(db, run, RunStatus.starting, "opened by the test, as a launcher leaves a started run")
        if status != RunStatus.starting:
            transitions.move(db, run, RunStatus(status), f"moved to {status} by the test")
        return run.id


def set_run(server: LiveServer, run_id: int, **columns: object) -> None:
    """Writes columns of a run straight into the server's database."""
    with server_db(server) as db:
        db.execute(update(Run).where(Run.id == run_id).values(**columns))


@contextlib.contextmanager
def server_db(server: LiveServer) -> Iterator[Session]:
    """One transaction on the server's database: its SQLite file unless it was given a URL."""
    engine = make_engine(
        server.env.get("RANKBOARD_DATABASE_URL") or f"sqlite:///{server.root / 'data' / 'rankboard.db'}"
    )
    try:
        with Session(engine) as db, db.begin():
            yield db
    finally:
        engine.dispose()


def run_processes(root: Path) -> list[int]:
    """Live processes started for runs under `root` (their environment names a run folder there)."""
    return [
        pid
        for run_dir in (root / "shared" / "logs").glob("run-*")
        for pid in processes.pids_with_env(wire.ENV_RUN_DIR, str(run_dir))
    ]


def points(api: httpx.Client, run_id: int, key: str, limit: int = 100_000) -> list[dict]:
    """A series' points, up to `limit`; none while the run has not reported the key (a 404 that names it)."""
    answer = api.get(f"/api/runs/{run_id}/metrics/{key}", params={"limit": limit})
    if answer.status_code == 404 and "has no metric" in answer.text:
        return []
    answer.raise_for_status()
    return answer.json()["points"]  # type: ignore[no-any-return]


def wait_for(predicate: Callable[[], T | None], timeout: float, interval: float = 0.2, what: str = "condition") -> T:
    """Polls `predicate` until it returns something truthy; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def server_sent_events(lines: Iterable[str]) -> Iterator[tuple[str | None, str, str]]:
    """Each message of an event stream's lines, as EventSource splits them: its id (None without one), its event and
    its data. A blank line ends a message; one without any (a keep-alive) comes as (None, "", ""), so that a reader
    can look at its clock."""
    last_id: str | None = None
    event = data = ""
    for line in lines:
        if line.startswith("id: "):
            last_id = line[4:]
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
        elif not line:
            yield last_id, event, data
            last_id, event, data = None, "", ""
