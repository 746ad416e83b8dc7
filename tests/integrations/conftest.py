"""A live server for the tests of the other trackers' importers and the training libraries' integrations, one per
module: each test makes runs of its own, told apart by their names and keys."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live import LiveServer, serving, wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serving(tmp_path_factory.mktemp("server")) as live:
        yield live


def imported(server: LiveServer, capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """`rankboard import ARGV...` against the server, as a user types it: its exit code, and what it printed on
    stdout (the summary) and stderr (each run as it is done, and errors)."""
    from app.cli import main

    code = main(["import", *map(str, argv), "--url", server.url])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def runs_by_key(server: LiveServer) -> dict[str, dict]:
    """Every run launched elsewhere, by its external key."""
    with server.api() as api:
        items = api.get("/api/runs", params={"limit": 500, "archived": "all"}).json()["items"]
    return {run["external_key"]: run for run in items if run["external_key"]}


def series(server: LiveServer, run_id: int, key: str) -> list[tuple[int, float, float]]:
    """A series' (step, value, time) points, in step order."""
    with server.api() as api:
        answer = api.get(f"/api/runs/{run_id}/metrics/{key}", params={"limit": 100_000})
        answer.raise_for_status()
    return [(p["step"], p["value"], p["time"]) for p in answer.json()["points"]]


SCRIPTS = Path(__file__).resolve().parent / "scripts"


def launch(server: LiveServer, *command: str | Path, torchrun: bool = False) -> subprocess.Popen[str]:
    """One of scripts/ as a user starts it, reporting to the server (RANKBOARD_URL); under `torchrun
    --nproc-per-node=2` where the library leaves starting the ranks to it, else `python` (Lightning's own launcher
    starts rank 1)."""
    start = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"] if torchrun else [
        sys.executable]  # fmt: skip
    env = {**os.environ, "RANKBOARD_URL": server.url, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([*start, *map(str, command)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip


def finished(process: subprocess.Popen[str], timeout: float = 240) -> str:
    """What the training printed, once it exited 0."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output = process.communicate()[0]
        raise AssertionError(f"the training did not end within {timeout} s: {output[-3000:]}") from None
    assert process.returncode == 0, output[-3000:]
    return output


def run_named(server: LiveServer, name: str) -> dict:
    """The newest run of that name, once it exists."""

    def newest() -> dict | None:
        with server.api() as api:
            runs = api.get("/api/runs", params={"q": name, "limit": 10}).json()["items"]
        return next((run for run in runs if run["name"] == name), None)

    return wait_for(newest, timeout=120, what=f"a run named {name}")


def stopped_midway(server: LiveServer, process: subprocess.Popen[str], name: str) -> tuple[dict, str]:
    """Stop a long training from the dashboard once it reports its third step; the run, and what it printed."""
    run = run_named(server, name)
    wait_for(lambda: _run(server, run["id"])["step"] >= 3, timeout=120, what="its third step")
    with server.api() as api:
        api.post(f"/api/runs/{run['id']}/stop").raise_for_status()
    output = finished(process)
    ended = wait_for(lambda: _run(server, run["id"], ended=True), timeout=60, what="the run's end")
    return ended, output


def _run(server: LiveServer, run_id: int, *, ended: bool = False) -> dict | None:
    """The run; with `ended`, only once it has."""
    with server.api() as api:
        run: dict = api.get(f"/api/runs/{run_id}").json()
    return run if not ended or run["status"] in ("succeeded", "failed", "stopped", "lost") else None


def ranks(server: LiveServer, run_id: int) -> list[tuple[int, str | None]]:
    """Each rank of the run and how its process ended."""
    with server.api() as api:
        return [(rank["rank"], rank["ended"]) for rank in api.get(f"/api/runs/{run_id}/ranks").json()]
