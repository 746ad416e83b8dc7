"""RankboardLogger in a real Lightning fit: 2 CPU ranks (gloo), started by Lightning's own launcher."""

from __future__ import annotations

import re
from pathlib import Path

from tests.integrations.conftest import SCRIPTS, finished, launch, ranks, run_named, series, stopped_midway
from tests.live import LiveServer


def test_a_fit_is_one_run_of_both_ranks_with_its_hyperparameters_metrics_and_checkpoints(server: LiveServer) -> None:
    folder = server.root / "shared" / "checkpoints" / "lightning"
    finished(launch(server, SCRIPTS / "lightning_fit.py", "lightning-fit", 10, 0, folder))
    run = run_named(server, "lightning-fit")
    assert (run["status"], run["launcher"], run["world_size"]) == ("succeeded", "external", 2)
    assert run["config"] == {"lr": 0.01, "hidden": 8, "pause": 0.0}  # save_hyperparameters()
    assert ranks(server, run["id"]) == [(0, "finished"), (1, "finished")]
    assert [step for step, _, _ in series(server, run["id"], "loss")] == list(range(10))
    with server.api() as api:
        checkpoints = api.get(f"/api/runs/{run['id']}/checkpoints").json()
    # ModelCheckpoint, left to its default names, saved as the dashboard lists: step-<step>.pt, with the loss.
    assert [(c["name"], c["step"]) for c in checkpoints] == [("step-00000005.pt", 5), ("step-00000010.pt", 10)]
    assert all("loss" in c["metrics"] for c in checkpoints)


def test_stop_from_the_dashboard_ends_fit_on_every_rank_at_the_same_step(server: LiveServer, tmp_path: Path) -> None:
    process = launch(server, SCRIPTS / "lightning_fit.py", "lightning-stop", 100_000, 0.05, tmp_path / "checkpoints")
    run, output = stopped_midway(server, process, "lightning-stop")
    assert run["status"] == "stopped"
    ended = {int(rank): int(step) for rank, step in re.findall(r"rank (\d) fit ended at step (\d+)", output)}
    assert sorted(ended) == [0, 1] and len(set(ended.values())) == 1 and ended[0] < 100_000
