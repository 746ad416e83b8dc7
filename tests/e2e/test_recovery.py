"""Exact recovery: a run whose rank is killed, and a run stopped then resumed, end with the very weights of the same
run left alone. Real 2-rank torchruns (gloo) under a real server; the reference run is trained once per module."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from app.launcher import processes
from tests.e2e.runs import FINAL, create, loss_steps, output, wait_status, worker_pid
from tests.live import LiveServer, run_processes, wait_for

pytestmark = pytest.mark.e2e

# Every piece of state a snapshot must carry is in play: a warm-up and cosine schedule, clipping, AdamW moments,
# validation, checkpoints mid-epoch, retention. 2 epochs of 256 steps.
OPTIONS: dict[str, Any] = {
    "workload": "mlp", "epochs": 2, "batch_size": 128, "seed": 7, "lr": 0.003, "lr_schedule": "cosine",
    "warmup_steps": 20, "grad_clip": 1.0, "val_every": 100, "checkpoint_every": 50, "checkpoint_unit": "step",
    "keep_last": 2,
}  # fmt: skip
TOTAL_STEPS = 512


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("recovery")
    live = LiveServer(root, RANKBOARD_STOP_GRACE_S="30", RANKBOARD_SLOTS="2")
    live.start()
    yield live
    live.stop()
    processes.kill_all(run_processes(root))


@pytest.fixture(scope="module")
def reference(server: LiveServer) -> dict[str, torch.Tensor]:
    """The final weights of the run never interrupted."""
    with server.api() as api:
        run = create(api, name="uninterrupted", **OPTIONS)
        done = wait_status(api, run["id"], FINAL, timeout=240)
        assert done["status"] == "succeeded", (done["status_reason"], output(server, run["id"]))
    return final_weights(server, api_run=done)


def final_weights(server: LiveServer, api_run: dict[str, Any]) -> dict[str, torch.Tensor]:
    path = server.root / "shared" / "checkpoints" / f"run-{api_run['id']}" / f"step-{TOTAL_STEPS:08d}.pt"
    return torch.load(path, weights_only=True)["model"]  # type: ignore[no-any-return]


def assert_bitwise_equal(weights: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    assert weights.keys() == reference.keys()
    differing = [name for name in weights if not torch.equal(weights[name], reference[name])]
    assert differing == []


def assert_every_step_once(api: httpx.Client, run_id: int) -> None:
    assert [step for step, _ in loss_steps(api, run_id)] == list(range(1, TOTAL_STEPS + 1))
    val = api.get(f"/api/runs/{run_id}/metrics/val_loss").json()["points"]
    assert [p["step"] for p in val] == [100, 200, 300, 400, 500]


def reach_step(api: httpx.Client, run_id: int, step: int) -> None:
    wait_for(lambda: api.get(f"/api/runs/{run_id}").json()["step"] > step, 180, what=f"run {run_id} past step {step}")


def test_a_killed_rank_is_restarted_and_the_run_ends_exactly_as_if_it_never_died(
    server: LiveServer, reference: dict[str, torch.Tensor]
) -> None:
    with server.api() as api:
        run = create(api, name="killed midway", max_restarts=1, **OPTIONS)
        reach_step(api, run["id"], 180)
        victim = worker_pid(server, local_rank=1)
        os.kill(victim, signal.SIGKILL)  # from outside, as the OOM killer would
        done = wait_status(api, run["id"], FINAL, timeout=240)
        assert done["status"] == "succeeded", (done["status_reason"], output(server, run["id"]))
        assert done["restarts"] == 1
        restarts = [e["reason"] for e in done["events"] if e["reason"].startswith("restart ")]
        assert restarts == [
            f"restart 1 of 1: local rank 1 (pid {victim}) was killed by SIGKILL; "
            "the workers resume from the newest snapshot"
        ]
        assert_every_step_once(api, run["id"])
        assert "resumed from" in output(server, run["id"])
    assert_bitwise_equal(final_weights(server, done), reference)


def test_a_stopped_run_resumes_as_the_same_run_and_ends_with_the_same_weights(
    server: LiveServer, reference: dict[str, torch.Tensor]
) -> None:
    with server.api() as api:
        run = create(api, name="stopped and resumed", **OPTIONS)
        reach_step(api, run["id"], 230)
        api.post(f"/api/runs/{run['id']}/stop")
        stopped = wait_status(api, run["id"], FINAL, timeout=120)
        assert stopped["status"] == "stopped"
        stopped_at = stopped["step"]
        assert 230 < stopped_at < TOTAL_STEPS

        resumed = api.post(f"/api/runs/{run['id']}/resume")
        assert resumed.status_code == 202 and resumed.json()["status"] == "queued"
        assert resumed.json()["id"] == run["id"]  # the same run, not a new one
        assert f"step-{stopped_at:08d}.pt" in resumed.json()["status_reason"]
        done = wait_status(api, run["id"], FINAL, timeout=240)
        assert done["status"] == "succeeded", (done["status_reason"], output(server, run["id"]))
        assert_every_step_once(api, run["id"])
        again = api.post(f"/api/runs/{run['id']}/resume")  # a finished run has nothing to resume
        assert again.status_code == 409 and "succeeded" in again.json()["detail"]
    assert_bitwise_equal(final_weights(server, done), reference)


def test_a_preempted_run_checkpoints_waits_resumes_and_ends_with_the_same_weights(
    server: LiveServer, reference: dict[str, torch.Tensor]
) -> None:
    """A high-priority run that needs the slots a low one holds asks it to stop: it checkpoints, waits in the queue
    at its priority, resumes once the high one is done, and ends bitwise equal to the run never interrupted."""
    with server.api() as api:
        low = create(api, name="preempted", priority="low", **OPTIONS)
        reach_step(api, low["id"], 150)
        high = create(api, name="urgent", priority="high", workload="mlp", epochs=1, batch_size=4096)
        stopped = wait_for(lambda: _event(api, low["id"], "preempted by run"), 60, what="the preemption")
        assert stopped["status"] == "stopping"
        assert stopped["reason"] == f"preempted by run {high['id']} (priority high): finishing the step, saving"
        urgent = wait_status(api, high["id"], FINAL, timeout=180)
        assert urgent["status"] == "succeeded", urgent["status_reason"]
        assert any(e["reason"] == f"waiting for run {low['id']} to stop: preempted to make room for it"
                   for e in urgent["events"])  # fmt: skip
        done = wait_status(api, low["id"], FINAL, timeout=240)
        assert done["status"] == "succeeded", (done["status_reason"], output(server, low["id"]))
        requeued = [e for e in done["events"] if e["status"] == "queued" and e["reason"].startswith("preempted by")]
        assert len(requeued) == 1 and requeued[0]["reason"].startswith(
            f"preempted by run {high['id']}: back in the queue at priority low; resumes from step-"
        )
        assert_every_step_once(api, low["id"])
        parts = {p["name"]: p["seconds"] for p in api.get(f"/api/runs/{low['id']}/goodput").json()["parts"]}
        assert parts["preempted"] > 0
    assert_bitwise_equal(final_weights(server, done), reference)


def _event(api: httpx.Client, run_id: int, begins: str) -> dict[str, Any] | None:
    return next((e for e in api.get(f"/api/runs/{run_id}").json()["events"] if e["reason"].startswith(begins)), None)
