"""The first non-finite loss, in a real 2-rank torchrun: rank 1's loss made NaN at step 7 is named exactly, by step
and rank, in rank 0's log; with stop_on_nonfinite the run stops there and its newest checkpoint holds only finite
weights, at the step before (whose update was the last one applied)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from rankboard import wire

from tests.trainer.test_train import (
    REPO,
    assert_ranks_exited,
    checkpoints,
    outside_dashboard_env,
    rank_log,
    sidecar,
    torchrun_command,
)

NAN_AT = 7


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("nan")
    command = torchrun_command(
        tmp, "--epochs", "1", "--batch-size", "512", "--checkpoint-unit", "step", "--checkpoint-every", "5",
        "--stop-on-nonfinite", "true", "--checkpoint-dir", str(tmp / "checkpoints"),
    )  # fmt: skip
    env = {**outside_dashboard_env(), wire.ENV_TEST_FAULT: f"nan:rank=1:step={NAN_AT}"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert_ranks_exited(tmp, done.returncode, done.stdout + done.stderr)
    return tmp


def test_the_step_and_rank_of_the_first_nan_are_named_exactly(nan_run: Path) -> None:
    log = rank_log(nan_run, 0)
    assert f"loss became NaN at step {NAN_AT} on rank 1 first (grad norm NaN at the same step)" in log, log
    assert f"stopping at step {NAN_AT - 1}: a non-finite loss" in log


def test_with_stop_on_nonfinite_the_last_checkpoint_holds_only_finite_weights(nan_run: Path) -> None:
    saved = checkpoints(nan_run)
    assert [wire.checkpoint_step(path.name) for path in saved] == [5, NAN_AT - 1]
    newest = torch.load(saved[-1], weights_only=True)
    assert all(torch.isfinite(tensor).all() for tensor in newest["model"].values())
    assert sidecar(saved[-1]).reason == "stop" and all(
        value == value for value in sidecar(saved[-1]).metrics.values()
    )  # no NaN among its metrics either


def test_a_replica_perturbed_once_is_named_at_the_next_fingerprint_step(tmp_path: Path) -> None:
    command = torchrun_command(
        tmp_path, "--epochs", "1", "--batch-size", "512", "--fingerprint-every", "25",
        "--checkpoint-dir", str(tmp_path / "checkpoints"),
    )  # fmt: skip
    env = {**outside_dashboard_env(), wire.ENV_TEST_FAULT: "perturb:rank=1:step=30"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert_ranks_exited(tmp_path, done.returncode, done.stdout + done.stderr)
    log = rank_log(tmp_path, 0)
    assert "rank 1's parameters differ from the other ranks' at step 50 (first seen" in log, log
    assert log.count("differ from") == 1  # not at step 25, before the perturbation; once, not at every check after
