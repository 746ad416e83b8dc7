"""Checkpoints end to end: retention as the trainer applies it, metadata as the server lists it, a run from one."""

from __future__ import annotations

import pytest
import torch

from tests.e2e.test_run_lifecycle import FINAL, create, loss_steps, wait_status
from tests.live import LiveServer

pytestmark = pytest.mark.e2e


def test_retention_keeps_the_newest_two_and_their_metadata_matches_the_stored_metrics(live_server: LiveServer) -> None:
    with live_server.api() as api:
        run = create(api, epochs=4, batch_size=256, keep_last=2)
        done = wait_status(api, run["id"], FINAL, timeout=180)
        assert done["status"] == "succeeded", done["status_reason"]
        per_epoch = done["total_steps"] // 4
        listed = api.get(f"/api/runs/{run['id']}/checkpoints").json()
        removed = api.get(f"/api/runs/{run['id']}/checkpoints/removed").json()
        losses = dict(loss_steps(api, run["id"]))
    assert [c["step"] for c in listed] == [3 * per_epoch, 4 * per_epoch]
    assert [r["step"] for r in removed] == [per_epoch, 2 * per_epoch]
    for checkpoint in listed:
        assert checkpoint["metrics"]["loss"] == pytest.approx(losses[checkpoint["step"]])
        assert checkpoint["epoch"] == checkpoint["step"] // per_epoch
        state = torch.load(live_server.root / "shared" / checkpoint["path"], weights_only=True)
        assert state["step"] == checkpoint["step"]
    assert listed[-1]["latest"] and not (live_server.root / "shared" / "checkpoints" / f"run-{run['id']}"
                                         / f"step-{per_epoch:08d}.pt").exists()  # fmt: skip


def test_a_run_started_from_a_checkpoint_begins_where_that_one_ended(live_server: LiveServer) -> None:
    with live_server.api() as api:
        first = create(api, epochs=2, batch_size=256)
        assert wait_status(api, first["id"], FINAL, timeout=180)["status"] == "succeeded"
        last = api.get(f"/api/runs/{first['id']}/checkpoints").json()[-1]
        fresh = create(api, epochs=1, batch_size=256, seed=1)
        tuned = create(api, epochs=1, batch_size=256, seed=1, init_from=last["path"], init_optimizer=True)
        for run in (fresh, tuned):
            assert wait_status(api, run["id"], FINAL, timeout=180)["status"] == "succeeded"
        first_losses = {run["id"]: loss_steps(api, run["id"])[0][1] for run in (fresh, tuned)}
    # The trained weights start far below a fresh model's loss (about 2.3, ln 10 for 10 classes).
    assert first_losses[tuned["id"]] < 0.75 * first_losses[fresh["id"]]
    assert first_losses[tuned["id"]] == pytest.approx(last["metrics"]["loss"], rel=0.5)
