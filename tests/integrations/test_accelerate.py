"""RankboardTracker in a real Accelerate loop: 2 CPU ranks (gloo) under torchrun, as `accelerate launch` starts it."""

from __future__ import annotations

import re

from tests.integrations.conftest import SCRIPTS, finished, launch, ranks, run_named, series, stopped_midway
from tests.live import LiveServer


def test_a_loop_is_one_run_of_both_ranks_with_init_trackers_config_and_its_metrics(server: LiveServer) -> None:
    finished(launch(server, SCRIPTS / "accelerate_loop.py", "accelerate-loop", 10, 0, torchrun=True))
    run = run_named(server, "accelerate-loop")
    assert (run["status"], run["world_size"]) == ("succeeded", 2)
    # Accelerate calls a tracker on its main process only; the other rank joined once the main one's run existed,
    # so the config is init_trackers'.
    assert run["config"] == {"lr": 0.01, "batch_size": 4}
    assert ranks(server, run["id"]) == [(0, "finished"), (1, "exited")]
    assert [step for step, _, _ in series(server, run["id"], "loss")] == list(range(10))


def test_a_loop_that_asks_stops_on_every_rank_at_the_same_step(server: LiveServer) -> None:
    process = launch(server, SCRIPTS / "accelerate_loop.py", "accelerate-stop", 100_000, 0.05, torchrun=True)
    run, output = stopped_midway(server, process, "accelerate-stop")
    assert run["status"] == "stopped"
    ended = {int(rank): int(step) for rank, step in re.findall(r"rank (\d) stopped at step (\d+)", output)}
    assert sorted(ended) == [0, 1] and len(set(ended.values())) == 1 and ended[0] < 100_000
