"""Bring your own script: the example DDP script runs through the dashboard and its metrics arrive; a script that
crashes at import ends `failed`, its traceback on the run page. Real server, real 2-rank torchrun (gloo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.runs import FINAL, create, loss_steps, output, wait_status
from tests.live import LiveServer, run_processes

pytestmark = pytest.mark.e2e
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"


def test_the_example_script_runs_through_the_dashboard_and_reports_every_step(live_server: LiveServer) -> None:
    offered = live_server.root / "shared" / "scripts" / "ddp_train.py"  # the server put it there on its first start
    assert offered.read_bytes() == EXAMPLE.read_bytes()
    with live_server.api() as api:
        run = create(api, script="scripts/ddp_train.py", script_args=["--epochs", "2", "--batch-size", "64"])
        done = wait_status(api, run["id"], FINAL, timeout=180)
        assert done["status"] == "succeeded", (done["status_reason"], output(live_server, run["id"]))
        steps = loss_steps(api, run["id"])
    assert [step for step, _ in steps] == list(range(1, 129))  # 8,192 samples / 2 ranks / 64, twice
    assert steps[-1][1] < 0.5 * steps[0][1]
    assert (live_server.root / "shared" / "checkpoints" / f"run-{run['id']}" / "snapshot.pt").exists()
    assert run_processes(live_server.root) == []


def test_a_script_that_crashes_at_import_fails_with_its_traceback_on_the_page(live_server: LiveServer) -> None:
    (live_server.root / "shared" / "broken.py").write_text("import torch\nimport a_module_that_is_not_installed\n")
    with live_server.api() as api:
        run = create(api, script="broken.py")
        done = wait_status(api, run["id"], FINAL, timeout=120)
        assert done["status"] == "failed" and "exited with 1" in done["status_reason"]
        page = api.get(f"/runs/{run['id']}").text
    assert "No module named &#39;a_module_that_is_not_installed&#39;" in page  # each rank's last lines
    assert "Traceback (most recent call last)" in output(live_server, run["id"])
