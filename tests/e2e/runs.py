"""Driving runs through the REST API of a live server, as an automation script would."""

from __future__ import annotations

import os

import httpx
from sqlalchemy import insert, update

from app.auth.passwords import sha256 as hash_token
from app.core.db import make_engine
from app.core.models import Run, RunStatus
from app.launcher import processes
from app.schemas.runs import RunCreate
from tests.live import LiveServer, points, run_processes, wait_for

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
    return [(p["step"], p["value"]) for p in points(api, run_id, "loss")]


def output(server: LiveServer, run_id: int) -> str:
    with server.api() as api:
        return "\n".join(line for o in api.get(f"/api/runs/{run_id}/output").json() for line in o["lines"])


def worker_pid(server: LiveServer, *, local_rank: int) -> int:
    """The pid of one trainer worker: torchrun gives only workers a LOCAL_RANK."""
    (pid,) = set(run_processes(server.root)) & set(processes.pids_with_env("LOCAL_RANK", str(local_rank)))
    return pid


def finished_runs_with_loss(server: LiveServer, lows: dict[str, float]) -> dict[str, int]:
    """Runs that reported a loss falling to `low` through the real ingest endpoint, then finished."""
    engine = make_engine(f"sqlite:///{server.root / 'data' / 'rankboard.db'}")
    made = {}
    try:
        for name, low in lows.items():
            spec = {**RunCreate(name=name).columns(), "config": RunCreate().config()}  # options: a config document
            with engine.begin() as db:
                run_id = db.execute(insert(Run).values(**spec, status=RunStatus.running, status_reason="",
                                                       token_hash=hash_token("cli-t0ken"), pid=os.getpid(),
                                                       pid_start_ticks=processes.start_ticks(os.getpid()))
                                    ).inserted_primary_key[0]  # fmt: skip
            points = [{"key": "loss", "step": step, "value": value} for step, value in ((1, 1.0), (2, low), (3, low))]
            answer = httpx.post(f"{server.url}/api/runs/{run_id}/metrics", json={"points": points},
                                headers={"Authorization": "Bearer cli-t0ken"})  # fmt: skip
            assert answer.status_code == 200, answer.text
            with engine.begin() as db:
                db.execute(update(Run).where(Run.id == run_id).values(status=RunStatus.succeeded))
            made[name] = run_id
    finally:
        engine.dispose()
    return made
