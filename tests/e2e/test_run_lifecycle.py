"""End to end: a real `rankboard serve` and a real 2-rank torchrun (gloo), read back as a user reads them."""

from __future__ import annotations

import os
import signal
from datetime import datetime
from pathlib import Path

import pytest
import torch

from tests.e2e.runs import FINAL, create, loss_steps, output, wait_status, worker_pid
from tests.live import LiveServer, run_processes, serving, wait_for

pytestmark = pytest.mark.e2e


def test_a_run_trains_reports_every_step_once_and_leaves_loadable_checkpoints(live_server: LiveServer) -> None:
    with live_server.api() as api:
        run = create(api, epochs=2, batch_size=128, checkpoint_every=1)
        done = wait_status(api, run["id"], FINAL, timeout=180)
        assert done["status"] == "succeeded", (done["status_reason"], output(live_server, run["id"]))

        steps = loss_steps(api, run["id"])
        assert [s for s, _ in steps] == list(range(1, done["total_steps"] + 1))  # every step, exactly once
        first, last = steps[:20], steps[-20:]
        assert sum(v for _, v in last) / 20 < 0.7 * sum(v for _, v in first) / 20  # the loss went down
        assert done["final_loss"] == pytest.approx(steps[-1][1])

        checkpoints = api.get(f"/api/runs/{run['id']}/checkpoints").json()
        assert [c["step"] for c in checkpoints] == [done["total_steps"] // 2, done["total_steps"]]
    for checkpoint in checkpoints:
        state = torch.load(live_server.root / "shared" / checkpoint["path"], weights_only=True)
        assert {"model", "optimizer", "epoch", "step"} <= set(state) and state["step"] == checkpoint["step"]
    assert run_processes(live_server.root) == []


def test_stop_midway_saves_a_checkpoint_and_leaves_no_process(live_server: LiveServer) -> None:
    with live_server.api() as api:
        run = create(api, epochs=1000)
        wait_for(lambda: api.get(f"/api/runs/{run['id']}").json()["step"] > 20, 120, what="training to start")
        assert run_processes(live_server.root) != []
        assert api.post(f"/api/runs/{run['id']}/stop").json()["status"] == "stopping"
        done = wait_status(api, run["id"], FINAL, timeout=60)
        assert done["status"] == "stopped", done["status_reason"]
        checkpoints = api.get(f"/api/runs/{run['id']}/checkpoints").json()
    assert len(checkpoints) == 1 and 20 < checkpoints[0]["step"] < done["total_steps"]
    assert torch.load(live_server.root / "shared" / checkpoints[0]["path"], weights_only=True)["step"] > 20
    assert run_processes(live_server.root) == []


def test_metrics_survive_a_server_restart_and_the_run_is_reattached(live_server: LiveServer) -> None:
    with live_server.api() as api:
        run = create(api, epochs=4, batch_size=64)
        wait_for(lambda: api.get(f"/api/runs/{run['id']}").json()["step"] > 50, 120, what="training to start")
    live_server.stop(signal.SIGKILL)  # the trainer keeps training and spools what it cannot send
    live_server.start()
    with live_server.api() as api:
        done = wait_status(api, run["id"], FINAL, timeout=240)
        assert done["status"] == "succeeded", done["status_reason"]
        assert done["step"] == done["total_steps"] > 50  # the progress of what was spooled reached the run too
        steps = [s for s, _ in loss_steps(api, run["id"])]
    assert steps == list(range(1, done["total_steps"] + 1))


def test_a_run_whose_rank_dies_ends_failed_and_leaves_no_process(live_server: LiveServer) -> None:
    with live_server.api() as api:
        run = create(api, epochs=1000)
        wait_for(lambda: api.get(f"/api/runs/{run['id']}").json()["step"] > 5, 120, what="training to start")
        # Kill rank 1 from outside, as the OOM killer would; torchrun takes rank 0 down and exits non-zero.
        os.kill(worker_pid(live_server, local_rank=1), signal.SIGKILL)
        done = wait_status(api, run["id"], FINAL, timeout=120)
    assert done["status"] == "failed" and "exited with" in done["status_reason"]
    assert run_processes(live_server.root) == []


def test_a_run_waits_queued_until_the_running_one_frees_its_processes(live_server: LiveServer) -> None:
    with live_server.api() as api:
        capacity = api.get("/api/health").json()["process_slots"]
        first = create(api, epochs=2, nproc_per_node=capacity)
        second = create(api, epochs=1, nproc_per_node=capacity)
        wait_status(api, first["id"], {"running"}, timeout=60)
        assert api.get(f"/api/runs/{second['id']}").json()["status"] == "queued"  # its processes would not fit
        first_done = wait_status(api, first["id"], FINAL, timeout=180)
        second_done = wait_status(api, second["id"], FINAL, timeout=180)
    assert (first_done["status"], second_done["status"]) == ("succeeded", "succeeded")
    assert datetime.fromisoformat(second_done["started_at"]) >= datetime.fromisoformat(first_done["finished_at"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: one for the server, one at least for runs")
def test_a_server_kept_to_one_cpu_starts_its_runs_on_every_cpu(tmp_path: Path) -> None:
    """RANKBOARD_SERVER_CPUS, as on a node that trains too: the server's threads, those it starts later included
    (the ingest threads take the run's first posts), keep to its CPU; the run's processes get every CPU."""
    every_cpu = os.sched_getaffinity(0)
    server_cpu = max(every_cpu)
    settings = {"RANKBOARD_SERVER_CPUS": str(server_cpu), "RANKBOARD_STOP_GRACE_S": "30", "RANKBOARD_SLOTS": "2"}
    with serving(tmp_path, **settings) as live, live.api() as api:
        run = create(api, epochs=1000)
        wait_for(lambda: api.get(f"/api/runs/{run['id']}").json()["step"] > 5, 120, what="training to start")
        run_pids = run_processes(tmp_path)
        assert len(run_pids) >= 3  # the waiter, torchrun, its two ranks
        assert {frozenset(os.sched_getaffinity(pid)) for pid in run_pids} == {frozenset(every_cpu)}
        assert live.process is not None
        threads = [int(task) for task in os.listdir(f"/proc/{live.process.pid}/task")]
        assert {frozenset(os.sched_getaffinity(tid)) for tid in threads} == {frozenset({server_cpu})}
        assert api.post(f"/api/runs/{run['id']}/stop").json()["status"] == "stopping"
        assert wait_status(api, run["id"], FINAL, timeout=60)["status"] == "stopped"
