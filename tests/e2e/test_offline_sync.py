"""Offline first (issue 40), end to end: a 2-rank DDP job under the user's own torchrun (gloo) with
RANKBOARD_MODE=offline never touches the network and writes its run to a folder; `rankboard sync` uploads it as one
run, with its config, both ranks' points exactly as logged, its ending and its checkpoints; a second sync stores
nothing twice."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live import KNOWN_EXIT_ABORT, REPO, LiveServer, free_port
from tests.trainer.test_offline import JOB, job_env, listening, logged, stored

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("offline-e2e"))
    live.start()
    yield live
    live.stop()


def sync(server: LiveServer, folder: Path) -> dict:
    command = [sys.executable, "-m", "app.cli", "sync", str(folder), "--url", server.url, "--json"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [said] = [json.loads(line) for line in done.stdout.splitlines()]
    return said  # type: ignore[no-any-return]


def test_an_offline_torchrun_job_syncs_as_one_run_with_every_ranks_points_once(
    server: LiveServer, tmp_path: Path
) -> None:
    checkpoints = server.root / "shared" / "checkpoints" / "offline-job"  # in the server's shared folder
    with listening() as listener:
        env = job_env(tmp_path, RANKBOARD_MODE="offline", RANKBOARD_OFFLINE_DIR=str(tmp_path / "offline"),
                      RANKBOARD_URL=f"http://127.0.0.1:{listener.getsockname()[1]}",
                      RANKBOARD_RUN_NAME="offline ddp")  # fmt: skip
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                   f"--master_port={free_port()}", str(JOB), "--steps", "40", "--checkpoints", str(checkpoints),
                   "--logged", str(tmp_path / "logged")]  # fmt: skip
        job = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
        with pytest.raises(BlockingIOError):
            listener.accept()  # no rank knocked, though RANKBOARD_URL names this socket
    assert job.returncode == 0 or KNOWN_EXIT_ABORT in job.stderr, job.stderr[-3000:]
    [folder] = (tmp_path / "offline").iterdir()
    assert len(list(folder.glob("*.join.json"))) == len(list(folder.glob("*.ended.json"))) == 2
    said = sync(server, folder)
    assert (said["ranks"], said["status"], said["refused"], said["unended"]) == (2, "succeeded", 0, [])
    with server.api() as api:
        run = api.get(f"/api/runs/{said['run_id']}").json()
        assert (run["name"], run["launcher"], run["world_size"], run["total_steps"]) == (
            "offline ddp",
            "external",
            2,
            40,
        )
        assert run["status_reason"] == "training finished: all 2 ranks ended"
        assert run["config"] == {"lr": 0.05, "steps": 40, "width": 8}
        for rank in (0, 1):
            for key, pairs in logged(tmp_path, rank).items():
                assert stored(api, run["id"], key, rank) == pairs, (key, rank)
        assert len(logged(tmp_path, 0)["train/loss"]) == 40 and "train/loss" not in logged(tmp_path, 1)
        ranks = api.get(f"/api/runs/{run['id']}/ranks").json()
        assert [(r["rank"], r["step"], r["ended"]) for r in ranks] == [(0, 40, "finished"), (1, 40, "exited")]
        names = [c["name"] for c in api.get(f"/api/runs/{run['id']}/checkpoints").json()]
        assert sorted(names) == ["step-00000020.pt", "step-00000040.pt"]
        series = [(key, rank) for rank in (0, 1) for key in logged(tmp_path, rank)]
        count = [len(stored(api, run["id"], key, rank)) for key, rank in series]
        again = sync(server, folder)
        assert (again["already"], again["run_id"], again["batches"]) == (True, run["id"], 0)
        assert [len(stored(api, run["id"], key, rank)) for key, rank in series] == count
        assert [r["id"] for r in api.get("/api/runs").json()["items"]] == [run["id"]]
