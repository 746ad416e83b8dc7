"""The preflight check in a real 2-rank gloo torchrun: a rank whose environment claims another torch is named, the
bandwidth test's result is kept in the run folder, and in "refuse" mode no step is taken."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from rankboard import wire

from tests.trainer.test_train import outside_dashboard_env, rank_log, torchrun_command
from trainer import preflight


def test_a_rank_with_another_torch_is_named_and_refuse_stops_the_run_before_its_first_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**outside_dashboard_env(), wire.ENV_RUN_DIR: str(run_dir),
           preflight.ENV_OVERRIDE: "1:torch=2.0.0+elsewhere"}  # fmt: skip
    command = torchrun_command(
        tmp_path,
        "--workload",
        "mlp",
        "--epochs",
        "1",
        "--preflight",
        "refuse",
        "--checkpoint-dir",
        str(tmp_path / "checkpoints"),
    )
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    out = rank_log(tmp_path, 0) + rank_log(tmp_path, 0, "stderr")
    assert "preflight: rank 1 has torch 2.0.0+elsewhere, the others" in out, out[-2000:]
    assert "training mlp" not in out and not list((tmp_path / "checkpoints").glob("*.pt"))
    result = wire.Preflight.from_json(json.loads((run_dir / wire.PREFLIGHT_FILE).read_text()))
    assert result.refused and not result.ok
    assert [(m.field, m.rank, m.value) for m in result.mismatches] == [("torch", 1, "2.0.0+elsewhere")]
    assert result.fingerprints[0]["torch"] == result.mismatches[0].common != "2.0.0+elsewhere"
    assert len(result.bus_gbps) == 2 and all(s is not None and s > 0 for s in result.bus_gbps)
    assert result.bytes == 4 * 2**20 and result.seconds > 0


def test_mismatches_name_the_odd_rank_and_slow_ranks_are_those_far_below_the_others() -> None:
    prints = [
        {"torch": "2.13.0", "gpu": "H100"},
        {"torch": "2.13.0", "gpu": "A100"},
        {"torch": "2.13.0", "gpu": "H100"},
    ]
    assert preflight.mismatches(prints) == [wire.Mismatch("gpu", 1, "A100", "H100")]
    assert preflight.slow_ranks([10.0, 9.0, 4.0, None]) == [2]
    assert preflight.slow_ranks([None]) == []
