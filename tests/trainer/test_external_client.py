"""The client of a run launched elsewhere: which run a process joins, and joining a server that is not there yet or
that refuses it, against the real server."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from rankboard import external, wire
from rankboard.report import Reporter
from sqlalchemy import func, select

from app.core.db import make_engine
from app.core.models import Run
from tests.live import LiveServer

WORKER = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}


def test_the_processes_of_one_job_share_a_key_and_the_user_can_name_it() -> None:
    slurm = {**WORKER, "SLURM_JOB_ID": "81234", "SLURM_CLUSTER_NAME": "c1", "TORCHELASTIC_RUN_ID": "none"}
    assert external.job_key(slurm) == "slurm:c1:81234"  # every node of the job, and the job again once requeued
    assert external.job_key({**WORKER, "TORCHELASTIC_RUN_ID": "job-7"}) == "torchrun:job-7"
    assert external.job_key({**slurm, wire.ENV_RUN_KEY: "sweep-3/lr-1e-4"}) == "sweep-3/lr-1e-4"
    # Static rendezvous (torchrun's "none"): the node's agent, this process's parent, by its pid and start time.
    agent = external.job_key({**WORKER, "TORCHELASTIC_RUN_ID": "none"})
    assert agent.startswith("torchrun-agent:") and f":{os.getppid()}:" in agent
    alone = external.job_key({})
    assert alone.startswith("process:") and f":{os.getpid()}:" in alone and alone != agent


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path / "server", RANKBOARD_SUPERVISE_INTERVAL_S="3600")
    yield live
    live.stop()


def reporter(server: LiveServer, spool: Path, key: str, token: str = "") -> Reporter:
    join = external.join_request(WORKER, key=key, name="elsewhere", config={"lr": 0.1}, takes_stop=False)
    return Reporter(server.url, None, token, spool, rank=1, flush_interval=0.02, join=join)


def test_a_process_started_before_the_server_joins_once_it_answers_and_loses_nothing(
    server: LiveServer, tmp_path: Path
) -> None:
    client = reporter(server, tmp_path / "spool", "job-early")
    for step in range(1, 501):
        client.log({"loss": 1 / step}, step=step)
    client.heartbeat(500)
    server.start()  # it was not there: the points waited in the spool
    client.close()
    with server.api() as api:
        [run] = api.get("/api/runs").json()["items"]
        points = api.get(f"/api/runs/{run['id']}/metrics/loss", params={"limit": 1000}).json()["points"]
        ranks = api.get(f"/api/runs/{run['id']}/ranks").json()
    assert (run["name"], run["launcher"], run["external_key"]) == ("elsewhere", "external", "job-early")
    assert [(p["step"], p["rank"]) for p in points] == [(step, 1) for step in range(1, 501)]
    assert [(r["rank"], r["step"], r["ended"]) for r in ranks] == [(1, 500, "exited")]


def test_a_refused_join_is_said_once_and_training_goes_on(
    server: LiveServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    server.env["RANKBOARD_ADMIN_PASSWORD"] = "an-admin-password"  # users exist: joining needs an API token
    server.start()
    client = reporter(server, tmp_path / "spool", "job-refused", token="not-a-token")
    for step in range(1, 101):
        client.log({"loss": 1 / step}, step=step)
    client.close()
    warnings = [line for line in capfd.readouterr().err.splitlines() if "refused this process's join" in line]
    assert len(warnings) == 1 and "HTTP 401" in warnings[0]
    assert not client.spool_path.exists()  # nothing kept to send later: a wrong token stays wrong
    engine = make_engine(f"sqlite:///{server.root / 'data' / 'rankboard.db'}")
    with engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(Run)) == 0
    engine.dispose()


def test_processes_joining_at_the_same_moment_share_one_run(server: LiveServer) -> None:
    server.start()
    environs = [{**WORKER, "RANK": str(rank), "WORLD_SIZE": "8"} for rank in range(8)]
    requests = [external.join_request(env, key="job-burst", name="b", config={}, takes_stop=False) for env in environs]
    barrier = threading.Barrier(len(requests))

    def join(request: wire.Join) -> tuple[int | None, external.Joined | None, str]:
        barrier.wait()
        return external.join(server.url, "", request)

    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(join, requests))
    assert [status for status, _, _ in answers] == [200] * 8, [detail for _, _, detail in answers]
    assert len({joined.run_id for _, joined, _ in answers if joined}) == 1
    assert len({joined.token for _, joined, _ in answers if joined}) == 8
