"""RankboardCallback in a real Hugging Face Trainer: 2 CPU ranks (gloo) under torchrun."""

from __future__ import annotations

import re
from pathlib import Path

from tests.integrations.conftest import SCRIPTS, finished, launch, ranks, run_named, series, stopped_midway
from tests.live import LiveServer


def test_training_is_one_run_of_both_ranks_with_its_arguments_and_what_the_trainer_logs(
    server: LiveServer, tmp_path: Path
) -> None:
    finished(launch(server, SCRIPTS / "hf_train.py", "hf-train", 10, 0, tmp_path / "out", torchrun=True))
    run = run_named(server, "hf-train")
    assert (run["status"], run["world_size"], run["total_steps"]) == ("succeeded", 2, 10)
    assert run["config"]["learning_rate"] == 0.01 and run["config"]["max_steps"] == 10  # the TrainingArguments
    assert ranks(server, run["id"]) == [(0, "finished"), (1, "finished")]
    assert [step for step, _, _ in series(server, run["id"], "loss")] == list(range(1, 11))
    assert len(series(server, run["id"], "learning_rate")) == 10
    with server.api() as api:  # its checkpoints are folders, which the dashboard's list does not show
        assert api.get(f"/api/runs/{run['id']}/checkpoints").json() == []


def test_stop_from_the_dashboard_ends_training_on_every_rank_at_the_same_step(
    server: LiveServer, tmp_path: Path
) -> None:
    process = launch(server, SCRIPTS / "hf_train.py", "hf-stop", 100_000, 0.05, tmp_path / "out", torchrun=True)
    run, output = stopped_midway(server, process, "hf-stop")
    assert run["status"] == "stopped"
    ended = {int(rank): int(step) for rank, step in re.findall(r"rank (\d) trained to step (\d+)", output)}
    assert sorted(ended) == [0, 1] and len(set(ended.values())) == 1 and ended[0] < 100_000
