"""The server's mapping of priorities and owners to Slurm's options, on the tests' real one-node cluster: a low-priority
run's job is submitted nice, under its owner's account and partition, as `scontrol show job` reads it back. (Without
accounting, this cluster keeps no QoS: that the directive is written is tests/app/test_slurm_launcher.py's.)"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from app.launcher import processes
from tests.e2e.runs import FINAL, output, wait_status
from tests.live import LiveServer, run_processes

pytestmark = pytest.mark.e2e
MAPPING = {
    "priority": {"low": {"qos": "scavenger", "nice": 500}},
    "owners": {"local": {"account": "local-lab", "partition": "debug"}},
}


@pytest.fixture(scope="module")
def server(slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("slurm-mapping")
    live = LiveServer(root, SLURM_CONF=slurm["SLURM_CONF"], RANKBOARD_LAUNCHER="slurm", RANKBOARD_SLURM_POLL_S="0.5",
                      RANKBOARD_SLURM_MAPPING=json.dumps(MAPPING))  # fmt: skip
    live.start()
    yield live
    live.stop()
    processes.kill_all(run_processes(root))


def job_fields(job_id: str, env: dict[str, str]) -> dict[str, str]:
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True,
                           timeout=30, check=True).stdout  # fmt: skip
    return dict(field.split("=", 1) for field in shown.split() if "=" in field)


def test_a_low_priority_run_is_submitted_nice_under_its_owners_account_and_partition(
    server: LiveServer, slurm: dict[str, str]
) -> None:
    with server.api() as api:
        made = api.post("/api/runs", json={"name": "mapped", "launcher": "slurm", "nproc_per_node": 1,
                                           "priority": "low", "epochs": 1, "batch_size": 4096})  # fmt: skip
        assert made.status_code == 201, made.text
        done = wait_status(api, made.json()["id"], FINAL, timeout=180)
    assert done["status"] == "succeeded", (done["status_reason"], output(server, done["id"]))
    submitted = next(e["reason"] for e in done["events"] if "submitted to Slurm" in e["reason"])
    assert submitted.endswith("(by the server's mapping: qos scavenger, nice 500, account local-lab, partition debug)")
    assert (done["slurm_qos"], done["slurm_nice"], done["slurm_account"]) == ("scavenger", 500, "local-lab")
    job = job_fields(done["job_id"], slurm)
    assert (job["Nice"], job["Account"], job["Partition"]) == ("500", "local-lab", "debug")
