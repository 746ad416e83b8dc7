"""Driving runs through the REST API of a live server, as an automation script would."""

from __future__ import annotations

import httpx

from app.launcher import processes
from tests.live import LiveServer, run_processes, wait_for

FINAL = {"succeeded", "failed", "stopped", "lost"}


def create(api: httpx.Client, **options: object) -> dict:
    response = api.post("/api/runs", json={"name": "e2e", "nproc_per_node": 2, **options})
    assert response.status_code == 201, response.text
    return response.json()


def wait_status(api: httpx.Client, run_id: int, statuses: set[str], timeout: float) -> dict:
    def reached() -> dict | None:
        run = api.get(f"/api/runs/{run_id}").json()
        return run if run["status"] in statuses else None

    return wait_for(reached, timeout, what=f"run {run_id} to become one of {sorted(statuses)}")  # type: ignore[no-any-return]


def loss_steps(api: httpx.Client, run_id: int) -> list[tuple[int, float]]:
    points = api.get(f"/api/runs/{run_id}/metrics/loss", params={"limit": 100_000}).json()["points"]
    return [(p["step"], p["value"]) for p in points]


def output(server: LiveServer, run_id: int) -> str:
    with server.api() as api:
        return "\n".join(line for o in api.get(f"/api/runs/{run_id}/output").json() for line in o["lines"])


def worker_pid(server: LiveServer, *, local_rank: int) -> int:
    """The pid of one trainer worker: torchrun gives only workers a LOCAL_RANK."""
    (pid,) = set(run_processes(server.root)) & set(processes.pids_with_env("LOCAL_RANK", str(local_rank)))
    return pid
