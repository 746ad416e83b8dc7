"""Bring your own script: the example DDP script runs through the dashboard and its metrics arrive; a script that
crashes at import ends `failed`, its traceback on the run page. Real server, real 2-rank torchrun (gloo)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.chart_sections import ChartSections
from tests.e2e.runs import FINAL, create, loss_steps, output, wait_status
from tests.live import LiveServer, points, run_processes, wait_for

pytestmark = pytest.mark.e2e
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"


def test_the_example_script_runs_through_the_dashboard_and_reports_every_step(live_server: LiveServer) -> None:
    offered = live_server.root / "shared" / "scripts" / "ddp_train.py"  # the server put it there on its first start
    assert offered.read_bytes() == EXAMPLE.read_bytes()
    with live_server.api() as api:
        # Small batches: 512 steps, so that it trains for longer than the reporter's first flush, even on a fast host.
        run = create(api, script="scripts/ddp_train.py", script_args=["--epochs", "2", "--batch-size", "16"])
        # It reports only report.log points, no progress: its steps alone show it training, on the API and the page.
        training = wait_for(lambda: seen_training(api, run["id"]), 120, interval=0.05, what="the run to train")
        assert training["status"] == "running" and training["step"] > 0, training
        page = api.get(f"/runs/{run['id']}").text
        done = wait_status(api, run["id"], FINAL, timeout=180)
        assert done["status"] == "succeeded", (done["status_reason"], output(live_server, run["id"]))
        steps = loss_steps(api, run["id"])
    assert [step for step, _ in steps] == list(range(1, 513))  # 8,192 samples / 2 ranks / 16, twice
    # Its step count: against a total only where the script declared one (report.init(total_steps=...)).
    shown = re.search(r'<dd id="step">(\d+)(?: of \d+ \([\d.]+%\))?</dd>', page)
    assert shown is not None and int(shown[1]) >= training["step"], "the run page shows no step of the training"
    assert steps[-1][1] < 0.5 * steps[0][1]
    assert (live_server.root / "shared" / "checkpoints" / f"run-{run['id']}" / "snapshot.pt").exists()
    assert run_processes(live_server.root) == []


def seen_training(api: httpx.Client, run_id: int) -> dict | None:
    """The run once it is running at a step above 0; fails at once if it ends before anyone could see that."""
    run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] not in FINAL, f"the run ended ({run['status']}) without being seen running at a step"
    return run if run["status"] == "running" and run["step"] > 0 else None


def test_a_script_that_crashes_at_import_fails_with_its_traceback_on_the_page(live_server: LiveServer) -> None:
    (live_server.root / "shared" / "broken.py").write_text("import torch\nimport a_module_that_is_not_installed\n")
    with live_server.api() as api:
        run = create(api, script="broken.py")
        done = wait_status(api, run["id"], FINAL, timeout=120)
        assert done["status"] == "failed" and "exited with 1" in done["status_reason"]
        # The page's logs panel, as the page fetches it once it is up: "What went wrong" leads it.
        panel = api.get(f"/runs/{run['id']}/logs", headers={"HX-Request": "true", "HX-Target": "logs"}).text
    assert "No module named &#39;a_module_that_is_not_installed&#39;" in panel
    assert "Traceback (most recent call last)" in output(live_server, run["id"])


def test_a_script_that_reports_nothing_is_running_once_its_processes_are_up(live_server: LiveServer) -> None:
    """Before, such a run said `starting` for its whole life; and its silence is no sign that it hangs."""
    (live_server.root / "shared" / "silent.py").write_text("import time\ntime.sleep(6)\nprint('done')\n")
    with live_server.api() as api:
        run = create(api, script="silent.py", nproc_per_node=1)
        running = wait_status(api, run["id"], {"running", *FINAL}, timeout=60)
        assert running["status"] == "running", running
        assert running["status_reason"] == "its processes are up; its script reports nothing to the dashboard " \
                                           "(no report.log call yet)"  # fmt: skip
        assert api.get(f"/api/runs/{run['id']}/health").json()["state"] == "ok"
        done = wait_status(api, run["id"], FINAL, timeout=60)
    assert done["status"] == "succeeded", done["status_reason"]


W_AND_B_STYLE = """
import time

import numpy as np
import torch
import torch.distributed as dist
from rankboard import report

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
report.init(total_steps=30)  # in a run the dashboard launched, only the total is taken
target, w = torch.tensor([1.0, -1.0]), torch.zeros(2, requires_grad=True)
for step in range(30):
    loss = ((w - target) ** 2).sum() * (rank + 1)
    loss.backward()
    dist.all_reduce(w.grad)
    with torch.no_grad():
        w -= 0.05 * w.grad / world
    w.grad = None
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    metrics = {"rank_loss": loss}  # a 0-d tensor, read with .item()
    if rank == 0:
        metrics |= {"train": {"loss": mean / world, "w": {"0": w[0], "1": w[1]}}, "lr": np.float32(0.05), "note": "x"}
        metrics |= {"a": {"b": {"c": step / 10}}, "损失": 1 / (step + 1), "many": {f"k{i:03d}": i for i in range(200)}}
    report.log(metrics)  # no step: each rank counts its own calls, 0 to 29
    time.sleep(0.05)  # long enough for the GPU sampler's samples, at unix-second steps, to come between
report.finished()
dist.destroy_process_group()
"""


def test_a_script_logging_as_wandb_users_do_gets_every_key_at_its_counted_step(live_server: LiveServer) -> None:
    """Nested keys, no step, tensors and numpy scalars, a string refused once, and a total declared with init(); no
    epoch that the script never counted, though the New-run form offers 10."""
    (live_server.root / "shared" / "wandb_style.py").write_text(W_AND_B_STYLE)
    with live_server.api() as api:
        run = create(api, script="wandb_style.py")
        done = wait_status(api, run["id"], FINAL, timeout=180)
        assert done["status"] == "succeeded", (done["status_reason"], output(live_server, run["id"]))
        stored = api.get(f"/api/runs/{run['id']}/metrics").json()
        keys = [key for key in stored if not key.startswith(("gpu/", "sys/", "many/"))]
        series = {key: [(p["step"], p["rank"]) for p in points(api, run["id"], key)] for key in keys}
        loss = [p["value"] for p in points(api, run["id"], "train/loss")]
        page = ChartSections(api.get(f"/runs/{run['id']}").text)
    assert (done["step"], done["total_steps"], done["epoch"], done["epochs"]) == (29, 30, 0, None)
    steps = list(range(30))
    assert series == {"lr": [(s, 0) for s in steps], "rank_loss": [(s, r) for s in steps for r in (0, 1)],
                      "train/loss": [(s, 0) for s in steps], "train/w/0": [(s, 0) for s in steps],
                      "train/w/1": [(s, 0) for s in steps], "a/b/c": [(s, 0) for s in steps],
                      "损失": [(s, 0) for s in steps]}  # fmt: skip
    assert sorted(k for k in stored if k.startswith("many/")) == [f"many/k{i:03d}" for i in range(200)]
    # On the run page, as the browser reads it: each key exactly one chart, in the section its prefix names.
    charted = [(key, figure["section"]) for figure in page.figures() for key in figure["keys"]]
    assert sorted(charted) == sorted((key, key.split("/")[0] if "/" in key else "") for key in stored)
    assert loss[-1] < 0.5 * loss[0]
    assert output(live_server, run["id"]).count("metric 'note': 'x' is not a number; skipped") == 1
