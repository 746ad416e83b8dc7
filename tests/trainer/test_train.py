"""The trainer as the server runs it: a real 2-rank torchrun on CPU, plus the config and the metrics client."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from rankboard import wire

from app.launcher import slurm
from tests.e2e.runs import FINAL, create, output, wait_status
from tests.live import KNOWN_EXIT_ABORT, serving
from trainer.config import TrainConfig
from trainer.workloads import WORKLOADS

REPO = Path(__file__).resolve().parents[2]
SAMPLES_PER_RANK = 65_536 // 2


# --- running torchrun -------------------------------------------------------------------------------------------


def torchrun_command(tmp: Path, *trainer_args: str) -> list[str]:
    """The command the server runs, with this test's folders."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--log-dir",
        str(tmp / "logs"),
        "--redirects",
        "3",
        "--max-restarts",
        "0",
        "-m",
        "trainer",
        *trainer_args,
    ]


def outside_dashboard_env() -> dict[str, str]:
    """This environment without the dashboard's settings; torchrun passes USR2 on, as the Slurm job script tells it."""
    return {name: value for name, value in os.environ.items() if not name.startswith("RANKBOARD_")} | {
        "PET_SIGNALS_TO_HANDLE": slurm.SIGNALS
    }


def rank_log(tmp: Path, local_rank: int, stream: str = "stdout") -> str:
    """What one rank wrote, from torchrun's `<log-dir>/<rdzv id>_<random>/attempt_0/<local rank>/` layout."""
    paths = list((tmp / "logs").glob(f"*/attempt_0/{local_rank}/{stream}.log"))
    return paths[0].read_text() if len(paths) == 1 else ""


def checkpoints(tmp: Path) -> list[Path]:
    return sorted((tmp / "checkpoints").glob(wire.CHECKPOINT_GLOB))


def sidecar(checkpoint: Path) -> wire.CheckpointSidecar:
    """What the server reads about a checkpoint: the JSON file beside it."""
    text = checkpoint.with_name(wire.sidecar_name(checkpoint.name)).read_text()
    return wire.CheckpointSidecar.from_json(json.loads(text))


@dataclass
class ShortRun:
    tmp: Path
    returncode: int
    output: str
    steps_per_epoch: int = field(default=SAMPLES_PER_RANK // 512)


SHORT_RUN_ARGS = ("--epochs", "2", "--batch-size", "512", "--checkpoint-every", "1", "--seed", "3")


def short_run(tmp: Path) -> ShortRun:
    command = torchrun_command(tmp, *SHORT_RUN_ARGS, "--checkpoint-dir", str(tmp / "checkpoints"))
    env = {**outside_dashboard_env(), wire.ENV_RUN_DIR: str(tmp / "run")}  # where the finished marker goes
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return ShortRun(tmp, done.returncode, done.stdout + done.stderr)


def assert_finished(tmp: Path, returncode: int, output: str) -> None:
    """The trainer's own record says the training finished, and no rank failed but in the known way."""
    assert (tmp / "run" / wire.FINISHED_MARKER).is_file(), output
    assert_ranks_exited(tmp, returncode, output)


def assert_ranks_exited(tmp: Path, returncode: int, output: str) -> None:
    """Every rank exited 0, or one aborted after its work was done in the known way and wrote nothing else.

    Not torchrun's exit code alone: rarely a rank aborts in torch's gloo teardown (KNOWN_EXIT_ABORT; see the DDP
    checklist), and torchrun then exits 1. The server judges a run the same way, by the trainer's own record.
    """
    ranks_stderr = {rank_log(tmp, r, "stderr").strip() for r in (0, 1)}
    assert returncode == 0 or ranks_stderr <= {"", KNOWN_EXIT_ABORT}, f"{output}\nthe ranks' stderr: {ranks_stderr}"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> ShortRun:
    return short_run(tmp_path_factory.mktemp("short"))


# --- torchrun: a complete run -----------------------------------------------------------------------------------


def test_a_short_run_writes_a_loadable_checkpoint_per_epoch(finished_run: ShortRun) -> None:
    assert_finished(finished_run.tmp, finished_run.returncode, finished_run.output)
    steps = finished_run.steps_per_epoch
    assert [p.name for p in checkpoints(finished_run.tmp)] == [f"step-{steps:08d}.pt", f"step-{2 * steps:08d}.pt"]
    assert {p.name for p in (finished_run.tmp / "checkpoints").iterdir()} == {
        name for p in checkpoints(finished_run.tmp) for name in (p.name, wire.sidecar_name(p.name))
    }, "a sidecar beside each, no retention log (nothing removed), no temporary file"
    for epoch, path in enumerate(checkpoints(finished_run.tmp), start=1):
        reason = "final" if epoch == 2 else "epoch"
        snapshot = torch.load(path, weights_only=True)
        assert snapshot.keys() == {
            "model", "optimizer", "scheduler", "scaler", "epoch", "epoch_step", "epoch_losses", "step", "world_size",
            "rng", "metrics", "config",
        }  # fmt: skip
        assert len(snapshot["rng"]) == 2 and snapshot["world_size"] == 2  # each rank's generators, for resuming
        assert (snapshot["epoch"], snapshot["step"]) == (epoch, epoch * steps)
        assert (sidecar(path).epoch, sidecar(path).step, sidecar(path).reason) == (epoch, epoch * steps, reason)
        assert TrainConfig(**snapshot["config"]).batch_size == 512
        assert snapshot["optimizer"]["state"], "the optimizer's moments are saved too"


def test_the_final_weights_load_into_a_fresh_student(finished_run: ShortRun) -> None:
    final = torch.load(checkpoints(finished_run.tmp)[-1], weights_only=True)
    student = WORKLOADS["mlp"].build_model()
    student.load_state_dict(final["model"])  # strict: the keys are the bare model's, not DDP's "module.*"


def test_both_ranks_report_and_the_loss_goes_down(finished_run: ShortRun) -> None:
    rank0, rank1 = rank_log(finished_run.tmp, 0), rank_log(finished_run.tmp, 1)
    assert "[rank 1] finished after 128 steps" in rank1
    epoch_losses = [float(x) for x in re.findall(r"^\[rank 0\] epoch \d+/2: .* mean loss ([\d.]+)$", rank0, re.M)]
    assert len(epoch_losses) == 2
    assert epoch_losses[1] < epoch_losses[0] < math.log(10), "from chance level (ln 10 = 2.30) downwards"
    assert "Traceback" not in rank_log(finished_run.tmp, 0, "stderr") + rank_log(finished_run.tmp, 1, "stderr")


def test_the_same_seed_gives_bitwise_identical_weights(finished_run: ShortRun, tmp_path: Path) -> None:
    again = short_run(tmp_path)
    assert_finished(again.tmp, again.returncode, again.output)
    first = torch.load(checkpoints(finished_run.tmp)[-1], weights_only=True)
    second = torch.load(checkpoints(again.tmp)[-1], weights_only=True)
    for name, tensor in first["model"].items():
        assert torch.equal(tensor, second["model"][name]), name
    for index, state in first["optimizer"]["state"].items():
        assert all(torch.equal(state[k], second["optimizer"]["state"][index][k]) for k in state)


def test_a_run_over_before_its_second_post_still_shows_its_throughput(tmp_path: Path) -> None:
    """Posting every 10 s, a 1-process run of one epoch (about a second here) sends its progress only at the end. That
    final report carries the rate last measured: a run's throughput, and a scaling sweep's speedup, come from it; and
    the epoch it finished, not the loop's counter one past it."""
    with serving(tmp_path, RANKBOARD_REPORT_S="10", RANKBOARD_SLOTS="1") as server, server.api() as api:
        run = create(api, nproc_per_node=1, epochs=1, batch_size=512)
        done = wait_status(api, run["id"], FINAL, timeout=120)
        assert done["status"] == "succeeded", (done["status_reason"], output(server, run["id"]))
        logged = api.get(f"/api/runs/{run['id']}/metrics/samples_per_s").json()["points"]
    assert len(logged) == done["total_steps"] and done["samples_per_s"] == logged[-1]["value"] > 0
    assert (done["epoch"], done["epochs"]) == (1, 1), "a finished run is at its last epoch, not one past it"


def test_without_torchrun_it_says_to_use_torchrun() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "--epochs", "1"],
        cwd=REPO,
        env=outside_dashboard_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "LOCAL_RANK is not set: start this under torchrun" in done.stderr


# --- torchrun: a stop request -----------------------------------------------------------------------------------


def wait_for_pids(tmp: Path, process: subprocess.Popen[str], timeout: float = 60.0) -> list[int]:
    """The workers' pids, once both ranks have started training."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "torchrun exited before training started"
        logs = [rank_log(tmp, rank) for rank in (0, 1)]
        if all("training mlp" in log for log in logs):
            return [int(re.search(r"started: pid (\d+)", log)[1]) for log in logs]  # type: ignore[index]
        time.sleep(0.2)
    raise AssertionError("the ranks did not start training in time")


def is_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited; only its parent has not reaped it


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGUSR2], ids=["SIGTERM", "SIGUSR2"])
def test_a_stop_signal_stops_every_process_after_a_checkpoint(tmp_path: Path, stop: signal.Signals) -> None:
    # The server's Popen: its own session, so that one killpg reaches torchrun (the workers are in sessions of
    # their own, and torchrun forwards the signal to them).
    process = subprocess.Popen(
        torchrun_command(tmp_path, "--epochs", "1000", "--checkpoint-dir", str(tmp_path / "checkpoints")),
        cwd=REPO,
        env=outside_dashboard_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        pids = wait_for_pids(tmp_path, process)
        time.sleep(1.0)
        os.killpg(process.pid, stop)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    # torch 2.13's torchrun re-raises the signal as SignalException after its workers exited 0: so exit 1, with a
    # traceback, whatever the workers did. The server must judge a stop by the trainer's files, not this code.
    assert process.returncode == 1, output
    assert "SignalException" in output
    assert not [pid for pid in pids if is_alive(pid)]
    [path] = checkpoints(tmp_path)
    step = torch.load(path, weights_only=True)["step"]
    assert 0 < step < 1000 * SAMPLES_PER_RANK // 64
    assert (sidecar(path).step, sidecar(path).reason) == (step, "stop")
    for rank in (0, 1):
        assert f"[rank {rank}] stopped on request at step {step} of" in rank_log(tmp_path, rank)
        assert "Traceback" not in rank_log(tmp_path, rank, "stderr")


# --- config -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("workload", "resnet"),
        ("epochs", 0),
        ("epochs", 100_001),
        ("epochs", 2.5),
        ("epochs", True),
        ("batch_size", 0),
        ("batch_size", 65_537),
        ("lr", 0.0),
        ("lr", -1e-3),
        ("lr", 10.5),
        ("lr", math.nan),
        ("checkpoint_every", 0),
        ("checkpoint_every", 100_001),
        ("seed", -1),
        ("checkpoint_dir", ""),
    ],
)
def test_a_bad_field_is_refused_by_name(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{name} "):
        TrainConfig(**{name: value})


def test_the_command_line_round_trips() -> None:
    config = TrainConfig(epochs=3, batch_size=128, lr=3e-4, checkpoint_every=2, seed=7, checkpoint_dir="/x/ck")
    assert TrainConfig.from_argv(config.to_argv()) == config
    assert config.to_argv()[:4] == ["--workload", "mlp", "--epochs", "3"]


def test_every_field_is_a_flag_with_its_help() -> None:
    help_text = " ".join(TrainConfig.argument_parser().format_help().split())
    for flag, words in [
        ("--batch-size", "samples per step on each rank"),
        ("--lr", "peak learning rate"),
        ("--checkpoint-every", "every this many units"),
        ("--grad-accum", "only the last one all-reduces"),
    ]:
        assert flag in help_text and words in help_text


def test_the_checkpoint_dir_comes_from_the_flag_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(wire.ENV_CHECKPOINT_DIR, raising=False)
    assert TrainConfig.from_argv([]).checkpoint_dir == "checkpoints"
    monkeypatch.setenv(wire.ENV_CHECKPOINT_DIR, "/shared/ck/run-1")
    assert TrainConfig.from_argv([]).checkpoint_dir == "/shared/ck/run-1"
    assert TrainConfig.from_argv(["--checkpoint-dir", "mine"]).checkpoint_dir == "mine"


def test_a_bad_flag_exits_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        TrainConfig.from_argv(["--epochs", "0"])
    assert exit_info.value.code == 2
    assert "epochs must be an integer >= 1" in capsys.readouterr().err


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**outside_dashboard_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_outside_a_dashboard_run_reporting_is_a_silent_no_op() -> None:
    done = run_python(
        "import threading; from rankboard import report; report.log({'loss': 1.0}, step=1); "
        "report.close(); assert threading.active_count() == 1, threading.enumerate()"
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


# --- boundaries -------------------------------------------------------------------------------------------------


def test_the_wire_and_the_client_do_not_load_torch() -> None:
    done = run_python("import sys, rankboard.wire, rankboard.report; assert 'torch' not in sys.modules")
    assert done.returncode == 0, done.stderr
