"""Offline first (issue 40): a process that reports with RANKBOARD_MODE=offline, or whose server stays away, keeps
its run in a folder, and `rankboard sync` uploads it later as one run, once, however often it runs or is cut short.
Against the real server; the jobs are plain processes here (tests/e2e/test_offline_sync.py runs a 2-rank torchrun)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from rankboard import external
from rankboard.offline import RankFiles
from rankboard.report import Reporter

from tests.live import REPO, LiveServer, free_port, points, wait_for

JOB = Path(__file__).with_name("offline_job.py")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("offline"), RANKBOARD_SUPERVISE_INTERVAL_S="3600")
    live.start()
    yield live
    live.stop()


@contextlib.contextmanager
def listening() -> Iterator[socket.socket]:
    """A socket on 127.0.0.1 that takes connections into its backlog without accepting them: any the client
    opened is still there to accept afterwards."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.setblocking(False)
        yield listener


def job_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("RANKBOARD_")}
    return env | {"TMPDIR": str(tmp_path), **settings}


def run_job(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(JOB), "--logged", str(tmp_path / "logged"), *args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def sync(url: str, *folders: Path) -> list[dict[str, Any]]:
    """`rankboard sync FOLDER... --json` as a user runs it; what it says of each run."""
    command = [sys.executable, "-m", "app.cli", "sync", *map(str, folders), "--url", url, "--json"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def logged(tmp_path: Path, rank: int = 0) -> dict[str, list[tuple[int, float]]]:
    """What the job's rank logged, key by key, as (step, value)."""
    body = json.loads((tmp_path / "logged" / f"rank{rank}.json").read_text())
    return {key: [(step, value) for step, value in pairs] for key, pairs in body.items()}


def stored(api: httpx.Client, run_id: int, key: str, rank: int = 0) -> list[tuple[int, float]]:
    return [(p["step"], p["value"]) for p in points(api, run_id, key) if p["rank"] == rank]


def test_an_offline_process_never_connects_and_its_failure_syncs_as_a_failed_run(
    server: LiveServer, tmp_path: Path
) -> None:
    with listening() as listener:
        env = job_env(tmp_path, RANKBOARD_MODE="offline", RANKBOARD_OFFLINE_DIR=str(tmp_path / "offline"),
                      RANKBOARD_URL=f"http://127.0.0.1:{listener.getsockname()[1]}")  # fmt: skip
        job = run_job(tmp_path, env, "--steps", "40", "--fail-at", "30")
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody knocked
    assert job.returncode == 1 and "RuntimeError: rank 0 gave up at step 30" in job.stderr
    [said] = sync(server.url, tmp_path / "offline")  # the folder that holds the run's folder
    with server.api() as api:
        run = api.get(f"/api/runs/{said['run_id']}").json()
        assert (run["status"], run["launcher"], run["total_steps"]) == ("failed", "external", 40)
        assert run["status_reason"].endswith("raised RuntimeError: rank 0 gave up at step 30")
        assert run["config"] == {"lr": 0.05, "steps": 40, "width": 8}
        assert stored(api, run["id"], "loss") == logged(tmp_path)["loss"] and len(logged(tmp_path)["loss"]) == 29
    assert (said["status"], said["stored"], said["refused"], said["unended"]) == ("failed", said["points"], 0, [])


def test_a_process_whose_server_stays_away_leaves_a_folder_that_syncs(server: LiveServer, tmp_path: Path) -> None:
    env = job_env(tmp_path, RANKBOARD_URL=f"http://127.0.0.1:{free_port()}", RANKBOARD_RUN_NAME="server away")
    job = run_job(tmp_path, env, "--steps", "40")
    assert job.returncode == 0, job.stderr
    said = re.search(r"`rankboard sync (\S+)` uploads it", job.stderr)
    assert said is not None, job.stderr
    folder = Path(said[1])
    assert folder.parent == tmp_path  # the spool folder, in the temporary folder, as said
    [synced] = sync(server.url, folder)
    with server.api() as api:
        run = api.get(f"/api/runs/{synced['run_id']}").json()
        assert (run["name"], run["status"], run["status_reason"]) == (
            "server away",
            "succeeded",
            "training finished: all 1 ranks ended",
        )
        assert stored(api, run["id"], "loss") == logged(tmp_path)["loss"]
        assert stored(api, run["id"], "rank/grad_norm") == logged(tmp_path)["rank/grad_norm"]
        assert [(r["rank"], r["step"], r["ended"]) for r in api.get(f"/api/runs/{run['id']}/ranks").json()] == [
            (0, 40, "finished")
        ]


class StallingProxy:
    """An HTTP proxy in front of the real server that forwards everything until `stall_after` batches have gone
    through, then holds the next batch without an answer, as a network that drops mid-way does."""

    def __init__(self, target: str, stall_after: int) -> None:
        self.target, self.stall_after = target, stall_after
        self.batches = 0
        self.stalled = threading.Event()
        self.released = threading.Event()
        self._client = httpx.Client(base_url=target, timeout=30)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if method == "POST" and path.endswith("/metrics"):
            self.batches += 1  # one client, one connection: no two at once
            if self.batches > self.stall_after:
                self.stalled.set()
                self.released.wait()
                return 503, b"{}"
        reply = self._client.request(method, path, content=body, headers=headers)
        return reply.status_code, reply.content

    def close(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.do_POST()

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {name: self.headers[name] for name in ("Authorization", "Content-Type") if self.headers[name]}
                status, reply = proxy.answer(self.command, self.path, headers, body)
                with contextlib.suppress(OSError):  # the held batch's sync was killed: nobody reads the answer
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


def keep_run(folder: Path, key: str, steps: int, per_batch: int) -> list[tuple[int, float]]:
    """An offline process's folder, made by the reporter itself: `steps` losses in batches of `per_batch`."""
    join = external.join_request({}, key=key, name=key, config={"lr": 0.1}, takes_stop=False)
    RankFiles.of(folder, join.host, join.rank).write_join(join)  # as report.init() does offline
    reporter = Reporter("", None, "", folder, max_batch=per_batch, start=False, join=join, offline=True)
    losses = [(step, step / 7) for step in range(steps)]
    for step, value in losses:
        reporter.log({"loss": value}, step=step)
    reporter.ended("finished")
    reporter.close()
    return losses


@pytest.mark.parametrize("marker", ["kept", "lost"])
def test_a_sync_cut_short_is_finished_by_the_next_and_nothing_is_stored_twice(
    server: LiveServer, tmp_path: Path, marker: str
) -> None:
    """20 batches; the first sync is killed while the server has taken 7. The next finishes the run: from the 8th
    with the marker the first left, or from the first without it, and stores each point once either way."""
    losses = keep_run(tmp_path / "run", f"cut-short-{marker}", steps=2000, per_batch=100)
    [files] = [RankFiles.from_join(path) for path in (tmp_path / "run").glob("*.join.json")]
    assert len(files.batches.read_bytes().splitlines()) == 20
    proxy = StallingProxy(server.url, stall_after=7)
    try:
        command = [sys.executable, "-m", "app.cli", "sync", str(tmp_path / "run"), "--url", proxy.url]
        cut = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(proxy.stalled.is_set, 60, what="the sync to reach the 8th batch")
        finally:
            cut.kill()
            cut.wait()
    finally:
        proxy.close()
    assert json.loads(files.synced.read_text())["lines"] == {files.batches.name: 7}
    if marker == "lost":
        files.synced.unlink()
    with server.api() as api:
        [run] = [run for run in api.get("/api/runs").json()["items"] if run["external_key"] == f"cut-short-{marker}"]
        assert run["status"] == "running" and len(stored(api, run["id"], "loss")) == 700
        [done] = sync(server.url, tmp_path / "run")
        sent = {"kept": (13, 7), "lost": (20, 0)}[marker]
        assert (done["batches"], done["resumed"], done["stored"], done["status"]) == (*sent, 1300, "succeeded")
        assert stored(api, run["id"], "loss") == losses
        [again] = sync(server.url, tmp_path / "run")
        assert (again["already"], again["batches"], again["run_id"]) == (True, 0, run["id"])
        assert stored(api, run["id"], "loss") == losses


def test_a_line_torn_by_a_crash_is_refused_and_counted_and_the_rest_arrive(server: LiveServer, tmp_path: Path) -> None:
    losses = keep_run(tmp_path / "run", "torn-line", steps=300, per_batch=100)
    [files] = [RankFiles.from_join(path) for path in (tmp_path / "run").glob("*.join.json")]
    first, *rest = files.batches.read_bytes().splitlines(keepends=True)
    files.batches.write_bytes(first[: len(first) // 2] + b"\n" + b"".join(rest))  # as the next process mends it
    [said] = sync(server.url, tmp_path / "run")
    assert (said["batches"], said["refused"], said["stored"], said["status"]) == (3, 1, 200, "succeeded")
    assert said["refused_why"].startswith("HTTP 4")
    with server.api() as api:
        assert stored(api, said["run_id"], "loss") == losses[100:]
