"""A running run that stops progressing: which rank stalled, whether its GPUs spin in a hung collective, and the
events the supervisor records. Data goes in through the real ingest endpoint; a heartbeat is made old by writing its
time into the database, rather than by waiting a minute."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import update

from app.auth.passwords import sha256 as hash_token
from app.core.models import Run, RunRank, RunStatus, utcnow
from app.launcher import processes
from tests.app.conftest import TOKEN, post


def running_run(client: TestClient) -> int:
    """A run as the launcher leaves it: running, taking metrics with TOKEN, its process being this (alive) one."""
    run_id = int(client.post("/api/runs", json={"name": "health"}).json()["id"])
    me = os.getpid()
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        assert run is not None
        run.status, run.token_hash = RunStatus.running, hash_token(TOKEN)
        run.pid, run.pid_start_ticks = me, processes.start_ticks(me)
    return run_id


def heartbeat(client: TestClient, run_id: int, rank: int, host: str, step: int) -> None:
    body = wire.Batch(heartbeat=wire.Heartbeat(rank=rank, host=host, step=step)).to_json()
    assert post(client, run_id, body).status_code == 200


def age(client: TestClient, run_id: int, rank: int, seconds: float) -> None:
    """Makes the rank's last heartbeat `seconds` old."""
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        at = utcnow() - timedelta(seconds=seconds)
        db.execute(update(RunRank).where(RunRank.run_id == run_id, RunRank.rank == rank).values(heartbeat_at=at))


def gpu_samples(client: TestClient, run_id: int, host: str, util: float, power: float, limit: float = 700.0) -> None:
    """The last 20 s of one GPU's samples, at step = unix seconds as the trainer's sampler sends them."""
    now = int(time.time())
    fields = {"util": util, "power": power, "power_limit": limit, "temp": 40.0}
    points = tuple(
        wire.Point(wire.GPU_KEY.format(host=host, index=0, field=field), now - ago, value, 0, float(now - ago))
        for ago in range(0, 20, 2)
        for field, value in fields.items()
    )
    assert post(client, run_id, wire.Batch(points).to_json()).status_code == 200


def health(client: TestClient, run_id: int) -> dict[str, Any]:
    response = client.get(f"/api/runs/{run_id}/health")
    assert response.status_code == 200
    return response.json()  # type: ignore[no-any-return]


def tick(client: TestClient, run_id: int) -> dict[str, Any]:
    client.app.state.supervisor.tick()  # type: ignore[attr-defined]
    return client.get(f"/api/runs/{run_id}").json()  # type: ignore[no-any-return]


def health_events(run: dict[str, Any]) -> list[str]:
    return [e["reason"] for e in run["events"] if e["reason"].startswith(("not progressing", "progressing again"))]


def test_a_rank_whose_heartbeat_stopped_is_named_on_the_api_and_the_page(client: TestClient) -> None:
    run_id = running_run(client)
    heartbeat(client, run_id, rank=0, host="node-a", step=130)
    heartbeat(client, run_id, rank=1, host="node-b", step=120)
    age(client, run_id, rank=1, seconds=90)

    found = health(client, run_id)
    assert found["state"] == "not_progressing"
    assert [(s["rank"], s["host"], s["step"]) for s in found["stalled"]] == [(1, "node-b", 120)]
    assert found["stalled"][0]["silent_s"] >= 90 and found["behind"] == [1]
    assert "rank 1 on node-b at step 120" in found["message"]
    assert "while the other ranks still move" in found["message"]

    page = client.get(f"/runs/{run_id}").text
    assert 'id="health"' in page and "rank 1 on node-b at step 120" in page
    assert '<tr data-rank="1">' in page and '<tr data-rank="0">' not in page


def test_fresh_heartbeats_are_ok_and_show_no_warning(client: TestClient) -> None:
    run_id = running_run(client)
    heartbeat(client, run_id, rank=0, host="node-a", step=130)
    heartbeat(client, run_id, rank=1, host="node-b", step=128)

    assert health(client, run_id) == {
        "state": "ok",
        "message": "",
        "stalled": [],
        "behind": [],
        "gpu": None,
        "stragglers": [],
    }
    assert 'id="health"' not in client.get(f"/runs/{run_id}").text


def test_busy_gpus_drawing_little_power_while_every_rank_stalls_read_as_a_hung_collective(client: TestClient) -> None:
    run_id = running_run(client)
    heartbeat(client, run_id, rank=0, host="node-a", step=121)
    heartbeat(client, run_id, rank=1, host="node-b", step=120)
    age(client, run_id, rank=0, seconds=75)
    age(client, run_id, rank=1, seconds=80)
    gpu_samples(client, run_id, "node-a", util=95, power=80)
    gpu_samples(client, run_id, "node-b", util=95, power=80)

    found = health(client, run_id)
    assert found["state"] == "hung_collective"
    assert "no rank has reported a new step" in found["message"]
    assert "rank 1 is behind the others' step 121" in found["message"]
    spinning = "GPUs busy at 95% but drawing only 80 W of 700 W: typical of ranks spinning in a hung NCCL collective"
    assert spinning in found["message"]
    assert "(its last step: rank 1 at step 120)" in found["message"] and "NCCL_DEBUG=INFO" in found["message"]
    assert found["gpu"] == {"gpus": 2, "of": 2, "util": 95.0, "power": 80.0, "power_limit": 700.0}
    assert "Hung collective?" in client.get(f"/runs/{run_id}").text


def test_stalled_ranks_with_gpus_at_full_power_or_idle_are_not_called_a_hung_collective(client: TestClient) -> None:
    run_id = running_run(client)
    heartbeat(client, run_id, rank=0, host="node-a", step=50)
    heartbeat(client, run_id, rank=1, host="node-b", step=50)
    age(client, run_id, rank=0, seconds=75)
    age(client, run_id, rank=1, seconds=75)
    gpu_samples(client, run_id, "node-a", util=98, power=620)  # really computing (one long step?)
    gpu_samples(client, run_id, "node-b", util=0, power=70)  # idle: stuck on the CPU, not in a collective

    found = health(client, run_id)
    assert found["state"] == "not_progressing" and found["gpu"] is None
    assert found["behind"] == [] and "NCCL" not in found["message"]


def test_the_supervisor_records_not_progressing_once_and_progressing_again_once(client: TestClient) -> None:
    run_id = running_run(client)
    heartbeat(client, run_id, rank=0, host="node-a", step=130)
    heartbeat(client, run_id, rank=1, host="node-b", step=120)
    assert health_events(tick(client, run_id)) == []

    age(client, run_id, rank=1, seconds=90)
    for _ in range(3):
        run = tick(client, run_id)
    assert run["status"] == "running" and run["status_reason"].startswith("not progressing: rank 1 on node-b")
    assert [reason.split(":")[0] for reason in health_events(run)] == ["not progressing"]

    heartbeat(client, run_id, rank=1, host="node-b", step=131)
    for _ in range(3):
        run = tick(client, run_id)
    assert run["status"] == "running" and run["status_reason"].startswith("progressing again")
    assert [reason.split(":")[0] for reason in health_events(run)] == ["not progressing", "progressing again"]
    assert health(client, run_id)["state"] == "ok"


def test_a_run_whose_processes_are_gone_is_lost_not_stalled(client: TestClient) -> None:
    run_id = running_run(client)
    heartbeat(client, run_id, rank=0, host="node-a", step=10)
    age(client, run_id, rank=0, seconds=300)
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.execute(update(Run).where(Run.id == run_id).values(pid_start_ticks=1))  # the pid is someone else's now

    run = tick(client, run_id)
    assert run["status"] == "lost" and health_events(run) == []
    assert health(client, run_id)["state"] == "ok"


def test_heartbeats_from_before_a_resume_do_not_count_against_the_new_launch(client: TestClient) -> None:
    run_id = running_run(client)
    heartbeat(client, run_id, rank=0, host="node-a", step=500)
    age(client, run_id, rank=0, seconds=3600)  # from the launch before the resume
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.execute(update(Run).where(Run.id == run_id).values(started_at=utcnow() - timedelta(seconds=10)))

    assert health(client, run_id)["state"] == "ok"


def test_health_of_a_run_that_does_not_exist_is_a_404(client: TestClient) -> None:
    assert client.get("/api/runs/999/health").status_code == 404


def test_a_script_that_only_logs_is_watched_by_its_steps_and_not_by_its_gpu_samples(client: TestClient) -> None:
    run_id = running_run(client)  # a script of the user's own: no progress, no rank heartbeats, only report.log
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).started_at = utcnow() - timedelta(seconds=300)
    loss = wire.Batch(tuple(wire.Point("loss", step, 1 / step) for step in range(1, 8))).to_json()
    assert post(client, run_id, loss).status_code == 200
    assert health(client, run_id)["state"] == "ok"  # its steps are its heartbeat

    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).heartbeat_at = utcnow() - timedelta(seconds=90)
    gpu_samples(client, run_id, "node-a", util=30.0, power=300.0)  # the sampler goes on while the script hangs
    stalled = health(client, run_id)
    assert stalled["state"] == "not_progressing" and "(last at step 7)" in stalled["message"]

    post(client, run_id, wire.Batch((wire.Point("loss", 8, 0.1),)).to_json())
    assert health(client, run_id)["state"] == "ok"


def test_a_script_that_never_reported_is_not_called_stalled_however_long_it_runs(client: TestClient) -> None:
    """Its silence is how it runs (it does not use the client); one that reported and fell silent is flagged."""
    run_id = running_run(client)
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.started_at, run.workload, run.script = utcnow() - timedelta(hours=2), "script", "silent.py"
    assert client.get(f"/api/runs/{run_id}/health").json()["state"] == "ok"
    post(client, run_id, wire.Batch((wire.Point("loss", 3, 0.5),)).to_json())
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).heartbeat_at = utcnow() - timedelta(hours=1)
    assert client.get(f"/api/runs/{run_id}/health").json()["state"] == "not_progressing"
