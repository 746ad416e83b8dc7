"""End to end through Slurm: a real server submits to the tests' one-node cluster; two torchrun agents in one job
step stand in for two nodes (c10d rendezvous between them), as the project's Slurm notes describe."""

from __future__ import annotations

import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from playwright.sync_api import Page, expect

from app.core.folders import RunFolders
from app.core.models import Run
from app.core.settings import Settings
from app.launcher import processes
from app.launcher.slurm import SlurmLauncher, job_name
from tests.e2e.runs import FINAL, create, loss_steps, output, wait_status
from tests.live import LiveServer, run_processes, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def slurm_server(slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server that submits to Slurm, one process per agent and two agents on the one node."""
    root = tmp_path_factory.mktemp("slurm-server")
    server = LiveServer(root, SLURM_CONF=slurm["SLURM_CONF"], RANKBOARD_LAUNCHER="slurm",
                        RANKBOARD_SLURM_AGENTS_PER_NODE="2", RANKBOARD_SLURM_POLL_S="0.5",
                        RANKBOARD_STOP_GRACE_S="30", RANKBOARD_SLOTS="2")  # fmt: skip
    server.start()
    yield server
    server.stop()
    processes.kill_all(run_processes(root))  # a failed test must not leave trainers behind


def slurm_run(server: LiveServer, **options: object) -> dict:
    with server.api() as api:
        return create(api, launcher="slurm", nproc_per_node=1, slurm_time_limit="10:00", **options)


def test_a_two_agent_run_succeeds_with_every_step_once_and_a_loadable_checkpoint(slurm_server: LiveServer) -> None:
    run = slurm_run(slurm_server, epochs=2, batch_size=128, checkpoint_every=1)
    with slurm_server.api() as api:
        done = wait_status(api, run["id"], FINAL, timeout=240)
        assert done["status"] == "succeeded", (done["status_reason"], output(slurm_server, run["id"]))
        assert done["job_id"] and done["job_state"] in ("RUNNING", "COMPLETING", "COMPLETED")
        assert any(f"Slurm job {done['job_id']}: running on" in e["reason"] for e in done["events"])
        steps = loss_steps(api, run["id"])
        assert [s for s, _ in steps] == list(range(1, done["total_steps"] + 1))  # every step, exactly once
        checkpoints = api.get(f"/api/runs/{run['id']}/checkpoints").json()
        page = api.get(f"/runs/{run['id']}").text
        keys = api.get(f"/api/runs/{run['id']}/metrics").json()
        files = api.get(f"/api/runs/{run['id']}/logs").json()
        rank_1 = api.get(f"/api/runs/{run['id']}/logs/1/stdout").json()["lines"]
    # Two agents on one host: each node's inventory, samples and heartbeats under its own name.
    host = socket.gethostname()
    assert sorted(node["host"] for node in done["gpus"]) == [f"{host}:0", f"{host}:1"]
    assert {f"sys/{host}:0/cpu_percent", f"sys/{host}:1/cpu_percent"} <= set(keys), keys
    with sqlite3.connect(slurm_server.root / "data" / "rankboard.db") as db:
        beats = db.execute("SELECT rank, host FROM run_ranks WHERE run_id = ? ORDER BY rank", (run["id"],)).fetchall()
    assert sorted(host for _rank, host in beats) == [f"{host}:0", f"{host}:1"] and [r for r, _h in beats] == [0, 1]
    assert any(e["status"] == "queued" and "submitted to Slurm" in e["reason"] for e in done["events"])
    assert checkpoints and checkpoints[-1]["step"] == done["total_steps"]
    # Each agent's ranks, by the global rank the worker marked, and Slurm's own output file as the launcher's.
    assert [(f["rank"], f["stream"], f["rank_guessed"]) for f in files] == [
        (0, "stdout", False), (0, "stderr", False), (1, "stdout", False), (1, "stderr", False), (None, "stdout", False),
    ], files  # fmt: skip
    run_dir = slurm_server.root / "shared" / "logs" / f"run-{run['id']}"
    slurm_output = run_dir / f"slurm-{done['job_id']}.out"  # the attempt's marker line, and what srun said
    assert files[-1]["size"] == slurm_output.stat().st_size and not (run_dir / "launcher.log").exists()
    assert any(line.startswith("[rank 1] started") for line in rank_1), rank_1
    assert not any(line.startswith("[rank 0]") for line in rank_1), rank_1
    state = torch.load(slurm_server.root / "shared" / checkpoints[-1]["path"], weights_only=True)
    assert state["step"] == done["total_steps"]
    assert "#SBATCH --ntasks-per-node=2" in page and "--rdzv-backend=c10d" in page  # the job script, on the page
    assert run_processes(slurm_server.root) == []


def test_stop_ends_stopped_with_a_checkpoint_and_no_process(slurm_server: LiveServer) -> None:
    run = slurm_run(slurm_server, epochs=1000)
    with slurm_server.api() as api:
        wait_for(lambda: api.get(f"/api/runs/{run['id']}").json()["step"] > 20, 180, what="training to start")
        assert run_processes(slurm_server.root) != []
        assert api.post(f"/api/runs/{run['id']}/stop").json()["status"] == "stopping"
        done = wait_status(api, run["id"], FINAL, timeout=90)
        assert done["status"] == "stopped", done["status_reason"]
        checkpoints = api.get(f"/api/runs/{run['id']}/checkpoints").json()
    assert len(checkpoints) == 1 and checkpoints[0]["step"] > 20
    assert torch.load(slurm_server.root / "shared" / checkpoints[0]["path"], weights_only=True)["step"] > 20
    wait_for(lambda: run_processes(slurm_server.root) == [] or None, 30, what="the job's processes to end")


def test_a_job_cancelled_by_hand_ends_cancelled_outside_rankboard(slurm_server: LiveServer, slurm: dict) -> None:
    run = slurm_run(slurm_server, epochs=1000)
    with slurm_server.api() as api:
        job = wait_for(lambda: api.get(f"/api/runs/{run['id']}").json()["job_id"], 60, what="the job id")
        subprocess.run(["scancel", job], env=slurm, check=True, timeout=30)
        done = wait_status(api, run["id"], FINAL, timeout=90)
    assert done["status"] == "stopped" and "cancelled outside Rankboard" in done["status_reason"]


def test_bad_slurm_options_are_refused_naming_the_field_and_nothing_is_submitted(
    slurm_server: LiveServer, slurm: dict
) -> None:
    before = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i"], env=slurm,
                            capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    with slurm_server.api() as api:
        runs_before = api.get("/api/runs").json()["total"]
        for options, field in [
            ({"slurm_partition": "gpu-huge"}, "slurm_partition"),
            ({"slurm_nodes": 5}, "slurm_nodes"),
            ({"slurm_nodes": 0}, "slurm_nodes"),
            ({"slurm_time_limit": "ten minutes"}, "slurm_time_limit"),
            ({"slurm_account": "a; rm -rf /"}, "slurm_account"),
        ]:
            answer = api.post("/api/runs", json={"name": "bad", "launcher": "slurm", "nproc_per_node": 1, **options})
            assert answer.status_code == 422, answer.text
            assert field in answer.text, answer.text
        runs_after = api.get("/api/runs").json()["total"]
    after = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i"], env=slurm,
                           capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    assert after == before and runs_after == runs_before


def test_a_job_slurm_refuses_ends_failed_in_slurms_own_words(slurm_server: LiveServer) -> None:
    run = slurm_run(slurm_server, slurm_gpus_per_node=1)  # valid, but the one node of this cluster has no GPU
    with slurm_server.api() as api:
        done = wait_status(api, run["id"], FINAL, timeout=60)
    assert done["status"] == "failed" and done["job_id"] is None
    assert done["status_reason"].startswith("Slurm refused the job: sbatch: error:"), done["status_reason"]


def test_the_time_limit_warning_requeues_the_same_run_which_ends_as_if_never_interrupted(
    slurm_server: LiveServer, slurm: dict
) -> None:
    options = {"epochs": 1, "batch_size": 128, "checkpoint_every": 1, "seed": 5}
    plain = slurm_run(slurm_server, **options)
    warned = slurm_run(slurm_server, **options, slurm_requeue=True, slurm_max_requeues=1)
    with slurm_server.api() as api:
        wait_for(lambda: api.get(f"/api/runs/{warned['id']}").json()["step"] > 5, 240, what="the second run to train")
        job = api.get(f"/api/runs/{warned['id']}").json()["job_id"]
        # What Slurm does near the time limit with --signal=B:USR2@<s>: USR2 to the batch shell only.
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], env=slurm, check=True, timeout=30)
        done = wait_status(api, warned["id"], FINAL, timeout=300)
        assert done["status"] == "succeeded", (done["status_reason"], output(slurm_server, warned["id"]))
        assert done["attempt"] == 2 and done["job_id"] == job
        assert any(e["reason"].startswith("attempt 2: Slurm's time limit was near") for e in done["events"])
        steps = loss_steps(api, warned["id"])
        assert [s for s, _ in steps] == list(range(1, done["total_steps"] + 1))  # every step once, across attempts
        reference = wait_status(api, plain["id"], FINAL, timeout=300)
        assert reference["status"] == "succeeded", reference["status_reason"]
        last = [api.get(f"/api/runs/{r['id']}/checkpoints").json()[-1] for r in (plain, warned)]
    weights = [torch.load(slurm_server.root / "shared" / c["path"], weights_only=True)["model"] for c in last]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])  # bitwise


def test_a_restarted_server_finds_its_slurm_runs_again(slurm_server: LiveServer, slurm: dict) -> None:
    running, queued, cancelled = (slurm_run(slurm_server, epochs=1000) for _ in range(3))
    with slurm_server.api() as api:
        wait_for(lambda: api.get(f"/api/runs/{running['id']}").json()["step"] > 5, 240, what="the first run to train")
        jobs = {r["id"]: api.get(f"/api/runs/{r['id']}").json()["job_id"] for r in (queued, cancelled)}
    slurm_server.stop(signal.SIGKILL)
    subprocess.run(["scancel", jobs[cancelled["id"]]], env=slurm, check=True, timeout=30)  # while nobody watches
    time.sleep(3)  # the first run trains on, its points spooled while the server is away
    slurm_server.start()
    with slurm_server.api() as api:
        gone = wait_status(api, cancelled["id"], FINAL, timeout=60)
        assert gone["status"] == "stopped" and "cancelled outside Rankboard" in gone["status_reason"]
        waiting = wait_for(lambda: (r := api.get(f"/api/runs/{queued['id']}").json())["job_state"] and r, 60,
                           what="the queued run's job state")  # fmt: skip
        assert waiting["status"] == "queued" and waiting["job_state"] == "PENDING", waiting
        assert waiting["job_reason"] == "Resources"  # the one node is busy with the first run
        before = api.get(f"/api/runs/{running['id']}").json()["step"]
        wait_for(lambda: api.get(f"/api/runs/{running['id']}").json()["step"] > before, 60, what="progress again")
        for run in (running, queued):
            api.post(f"/api/runs/{run['id']}/stop")
        ends = [wait_status(api, run["id"], FINAL, timeout=120) for run in (running, queued)]
        steps = [s for s, _ in loss_steps(api, running["id"])]
    assert [e["status"] for e in ends] == ["stopped", "stopped"], [e["status_reason"] for e in ends]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] > before  # nothing lost while it was away
    wait_for(lambda: run_processes(slurm_server.root) == [] or None, 30, what="the jobs' processes to end")


@pytest.mark.browser
def test_from_the_form_a_slurm_run_waits_with_its_reason_runs_and_stops(
    slurm_server: LiveServer, slurm: dict, page: Page, tmp_path: Path
) -> None:
    tmp_path.chmod(0o755)
    blocker = tmp_path / "blocker.sh"  # holds the one node, so that the run must wait for Resources
    blocker.write_text("#!/bin/bash\n#SBATCH --ntasks=2 --cpus-per-task=1\nsleep 600\n")
    held = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/blocker.out", str(blocker)], env=slurm,
                          capture_output=True, text=True, check=True, timeout=30).stdout.strip()  # fmt: skip
    try:
        page.goto(f"{slurm_server.url}/runs/new")
        page.get_by_label("Name").fill("slurm from the browser")
        page.get_by_label("Processes per node").fill("1")
        page.get_by_label("Epochs").fill("1000")
        page.get_by_label("Run on").select_option("slurm")
        page.get_by_label("Time limit").fill("10:00")
        page.get_by_label("Partition").select_option("debug")  # offered from sinfo
        page.get_by_role("button", name="Start run").click()
        expect(page.get_by_role("heading", name="slurm from the browser")).to_be_visible()
        expect(page.locator("#slurm-job")).to_contain_text("PENDING (Resources)", timeout=60_000)
        expect(page.locator("#status")).to_have_text("queued")
    finally:
        subprocess.run(["scancel", held], env=slurm, timeout=30)
    expect(page.locator("#slurm-job")).to_contain_text("RUNNING on", timeout=60_000)
    expect(page.locator("#status")).to_have_text("running", timeout=120_000)
    # Each agent's rank live in the log panel (the second agent's rank 1 as well), and Slurm's own output beside them.
    lines = page.locator("#log-lines")
    expect(lines).to_contain_text("[rank 0] started", timeout=60_000)
    page.locator("#log-rank").select_option("1")
    expect(lines).to_contain_text("[rank 1] started", timeout=30_000)
    page.locator("#log-rank").select_option("launcher")
    expect(page.locator("#log-rank")).to_contain_text("Slurm output")
    expect(lines).to_contain_text("--- rankboard launch", timeout=30_000)
    page.get_by_text("Configuration and command").click()
    expect(page.locator("#job-script")).to_contain_text("#SBATCH --time=10:00")
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#status")).to_have_text("stopped", timeout=120_000)
    expect(page.locator(".explain")).to_have_count(0)  # stopped on request: Rankboard's own scancel is no failure
    wait_for(lambda: run_processes(slurm_server.root) == [] or None, 30, what="the job's processes to end")


def test_your_own_script_runs_through_slurm_as_it_does_here(slurm_server: LiveServer) -> None:
    run = slurm_run(slurm_server, script="scripts/ddp_train.py", script_args=["--epochs", "1", "--batch-size", "32"])
    with slurm_server.api() as api:
        done = wait_status(api, run["id"], FINAL, timeout=240)
        assert done["status"] == "succeeded", (done["status_reason"], output(slurm_server, run["id"]))
        steps = loss_steps(api, run["id"])
    assert [step for step, _ in steps] == list(range(1, 129))  # 8,192 samples / 2 agents / 32: every step once
    assert (slurm_server.root / "shared" / "checkpoints" / f"run-{run['id']}" / "snapshot.pt").exists()


def test_a_submission_whose_reply_was_lost_is_cancelled_before_the_run_is_submitted_again(
    slurm: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    tmp_path.chmod(0o755)
    folders = RunFolders(tmp_path / "shared")
    launcher = SlurmLauncher(Settings(data_dir=tmp_path, shared_dir=tmp_path / "shared"), folders)
    run = Run(id=4242, name="lost reply", launcher="slurm", workload="mlp", nproc_per_node=1, max_restarts=0,
              epochs=1, slurm_nodes=1, slurm_cpus_per_task=1, slurm_gpus_per_node=0, slurm_requeue=False,
              created_at=datetime.now(UTC))  # fmt: skip
    lost = launcher.start(run, token="first", devices=[])  # the server died before it recorded this job id
    again = launcher.start(run, token="second", devices=[])
    listed = subprocess.run(["squeue", "--noheader", "--states=all", f"--name={job_name(run)}", "--format=%i|%T|%r"],
                            env=slurm, capture_output=True, text=True, check=True, timeout=30).stdout  # fmt: skip
    subprocess.run(["scancel", str(again.job_id)], env=slurm, timeout=30)
    jobs = dict(line.split("|", 1) for line in listed.split())
    # The lost one never ran (held until its id is on record), and only the second is left to run.
    assert jobs == {lost.job_id: "CANCELLED|JobHeldUser", again.job_id: "PENDING|JobHeldUser"}, listed
