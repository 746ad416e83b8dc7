"""A job the dashboard did not start: the example script under the user's own plain torchrun (2 ranks, gloo), in a
folder that also holds a `trainer.py` of the user's own, reports into one run through `report.init`; the dashboard
shows it as launched elsewhere and can stop it, since the script reads the request."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.runs import FINAL, loss_steps, wait_status
from tests.live import LiveServer, free_port, wait_for

pytestmark = pytest.mark.e2e
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("external"), RANKBOARD_SLOTS="2")
    live.start()
    yield live
    live.stop()


def start_job(folder: Path, server: LiveServer, name: str, *args: str) -> subprocess.Popen[bytes]:
    """`torchrun --nproc_per_node=2 train.py` as a user types it, told only where the dashboard is."""
    folder.mkdir(parents=True)
    shutil.copy(EXAMPLE, folder / "train.py")
    # Beside the script, so first on its sys.path: had the client imported `trainer`, this would be it.
    (folder / "trainer.py").write_text('raise ImportError("the user\'s own trainer.py, imported by the client")\n')
    env = {name: value for name, value in os.environ.items() if not name.startswith("RANKBOARD_")}
    env |= {"RANKBOARD_URL": server.url, "RANKBOARD_RUN_NAME": name}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
               "train.py", "--snapshot", str(folder / "snapshot.pt"), *args]  # fmt: skip
    with open(folder / "job.log", "wb") as log:
        return subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)


def only_run(api: httpx.Client, name: str) -> dict | None:
    runs = [run for run in api.get("/api/runs").json()["items"] if run["name"] == name]
    assert len(runs) <= 1, f"the job's ranks made {len(runs)} runs"
    return runs[0] if runs else None


def test_a_job_of_plain_torchrun_reports_into_one_run_with_every_rank(server: LiveServer, tmp_path: Path) -> None:
    job = start_job(tmp_path / "job", server, "to the end", "--epochs", "1", "--batch-size", "64")
    assert job.wait(timeout=180) == 0, (tmp_path / "job" / "job.log").read_text()[-3000:]
    with server.api() as api:
        run = wait_status(api, wait_for(lambda: only_run(api, "to the end"), 30)["id"], FINAL, timeout=30)
        assert (run["launcher"], run["status"], run["world_size"]) == ("external", "succeeded", 2), run
        assert run["status_reason"] == "training finished: all 2 ranks ended"
        assert run["config"]["epochs"] == 1 and run["external_key"].startswith("torchrun-agent:")
        # Every step's loss once (8,192 samples / 2 ranks / 64), whatever the retries; both ranks' heartbeats.
        assert [step for step, _ in loss_steps(api, run["id"])] == list(range(1, 65))
        ranks = api.get(f"/api/runs/{run['id']}/ranks").json()
        assert [(r["rank"], r["step"], r["ended"]) for r in ranks] == [(0, 64, "finished"), (1, 64, "exited")]
        assert [node["host"] for node in run["gpus"]] != []  # its node sampled (CPU and memory here, no NVML)
        page = api.get(f"/runs/{run['id']}").text
    assert "Launched elsewhere: job <code>torchrun-agent:" in page and "Stop</button>" not in page


def test_stop_on_the_dashboard_stops_every_rank_of_a_job_launched_elsewhere(server: LiveServer, tmp_path: Path) -> None:
    job = start_job(tmp_path / "job", server, "stopped", "--epochs", "200", "--batch-size", "16")
    try:
        with server.api() as api:
            named = wait_for(lambda: only_run(api, "stopped") if job.poll() is None else "ended", 120)
            assert named != "ended", (tmp_path / "job" / "job.log").read_text()[-3000:]
            run_id = named["id"]  # type: ignore[index]
            wait_status(api, run_id, {"running"}, timeout=60)
            page = api.get(f"/runs/{run_id}").text
            assert "Stop</button>" in page  # the script said it reads stop requests
            assert api.post(f"/api/runs/{run_id}/stop").status_code == 202
            assert job.wait(timeout=60) == 0
            run = wait_status(api, run_id, FINAL, timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    log = (tmp_path / "job" / "job.log").read_text()
    assert run["status"] == "stopped" and run["status_reason"] == "stopped on request: all 2 ranks ended"
    assert "[rank 0] stopping at step" in log and "[rank 1] stopping at step" in log


def test_a_users_own_sbatch_job_on_two_nodes_joins_one_run_by_its_job_id(
    slurm: dict[str, str], server: LiveServer, tmp_path: Path
) -> None:
    """The user's job script, not ours: one srun task per "node" (two on this one host), each a torchrun agent."""
    tmp_path.chmod(0o755)
    shutil.copy(EXAMPLE, tmp_path / "train.py")
    agent = (f"exec {sys.executable} -m torch.distributed.run --nnodes=2 --nproc-per-node=1 "
             f"--node-rank=$SLURM_PROCID --master-addr=127.0.0.1 --master-port={free_port()} "
             f"{tmp_path}/train.py --epochs 1 --batch-size 128 --snapshot {tmp_path}/snapshot.pt")  # fmt: skip
    (tmp_path / "job.sh").write_text(f"#!/bin/bash\n#SBATCH --ntasks=2 --cpus-per-task=1\nsrun bash -c '{agent}'\n")
    env = {name: value for name, value in os.environ.items() if not name.startswith("RANKBOARD_")}
    env |= {**slurm, "RANKBOARD_URL": server.url, "RANKBOARD_RUN_NAME": "own sbatch"}
    submitted = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/out.txt", str(tmp_path / "job.sh")],
                               capture_output=True, text=True, env=env, timeout=30, check=True)  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    with server.api() as api:
        found = wait_for(lambda: only_run(api, "own sbatch"), 120, what="the job's run")
        run = wait_status(api, found["id"], FINAL, timeout=180)
        output = (tmp_path / "out.txt").read_text()[-3000:] if (tmp_path / "out.txt").exists() else ""
        assert (run["status"], run["external_key"]) == ("succeeded", f"slurm:ci:{job_id}"), (run, output)
        ranks = api.get(f"/api/runs/{run['id']}/ranks").json()
        # 8,192 samples / 2 ranks / 128: every rank at the last step, each from its own node's agent.
        assert [(r["rank"], r["step"]) for r in ranks] == [(0, 32), (1, 32)]
        assert len({r["host"] for r in ranks}) == 2 and len(run["gpus"]) == 2  # two "nodes", each sampled
        assert [step for step, _ in loss_steps(api, run["id"])] == list(range(1, 33))
