"""Checkpoints: sidecars, retention, a write that fails, starting from one; real 2-rank torchruns on CPU."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from rankboard import wire
from torch.utils.data import DistributedSampler

from tests.live import LiveServer, open_run
from tests.trainer.test_train import (
    REPO,
    SAMPLES_PER_RANK,
    assert_finished,
    outside_dashboard_env,
    rank_log,
    torchrun_command,
)
from tests.trainer.test_train import sidecar as read_sidecar
from trainer import checkpoints
from trainer.config import TrainConfig
from trainer.workloads import WORKLOADS

TOKEN = "checkpoint-tests"

# --- helpers ----------------------------------------------------------------------------------------------------


class ReportingServer:
    """The real server with a run opened for the trainer to report to: it keeps the losses the dashboard plots."""

    def __init__(self, root: Path) -> None:
        self.live = LiveServer(root, RANKBOARD_SUPERVISE_INTERVAL_S="3600")  # the run is opened, never launched
        self.live.start()
        self.run_id = open_run(self.live, TOKEN)

    def env(self, run_dir: Path) -> dict[str, str]:
        """The launcher's environment for a dashboard run that reports here."""
        return {
            **outside_dashboard_env(),
            wire.ENV_RUN_ID: str(self.run_id),
            wire.ENV_SERVER_URL: self.live.url,
            wire.ENV_TOKEN: TOKEN,
            wire.ENV_RUN_DIR: str(run_dir),
        }

    def losses(self) -> dict[int, float]:
        """Every step's loss as stored, averaged over the ranks by the trainer."""
        with self.live.api() as api:
            points = api.get(f"/api/runs/{self.run_id}/metrics/loss", params={"limit": 100_000}).json()["points"]
        return {p["step"]: wire.decode_value(p["value"]) for p in points}


@pytest.fixture
def ingest(tmp_path: Path) -> Iterator[ReportingServer]:
    server = ReportingServer(tmp_path / "server")
    yield server
    server.live.stop()


@dataclass
class Run:
    tmp: Path
    returncode: int
    output: str
    seconds: float

    @property
    def folder(self) -> Path:
        return self.tmp / "checkpoints"

    def log(self, rank: int, stream: str = "stdout") -> str:
        return rank_log(self.tmp, rank, stream)

    def assert_finished(self) -> None:
        assert_finished(self.tmp, self.returncode, self.output)


def train(tmp: Path, *args: str, env: dict[str, str] | None = None, file_size_limit: int | None = None) -> Run:
    """One torchrun of the trainer, with its checkpoints in `tmp/checkpoints` unless args name another folder."""
    tmp.mkdir(parents=True, exist_ok=True)
    if "--checkpoint-dir" not in args:
        args = (*args, "--checkpoint-dir", str(tmp / "checkpoints"))

    def limit_file_size() -> None:  # in the child, before exec: torchrun and its workers inherit it
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    started = time.monotonic()
    done = subprocess.run(
        torchrun_command(tmp, *args),
        cwd=REPO,
        env=env or {**outside_dashboard_env(), wire.ENV_RUN_DIR: str(tmp / "run")},  # for the finished marker
        preexec_fn=limit_file_size if file_size_limit is not None else None,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Run(tmp, done.returncode, done.stdout + done.stderr, time.monotonic() - started)


def names(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}


def first_step_loss(model: torch.nn.Module, *, seed: int, batch_size: int) -> float:
    """The loss a 2-rank run with this seed computes at its first step with these weights, averaged over ranks."""
    dataset, _validation = WORKLOADS["mlp"].build_data()
    losses = []
    for rank in (0, 1):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=seed, drop_last=True)
        sampler.set_epoch(1)
        inputs, targets = dataset[list(sampler)[:batch_size]]
        with torch.no_grad():
            losses.append(WORKLOADS["mlp"].loss(model(inputs), targets).item())
    return sum(losses) / 2


# --- a. sidecars and retention, in a real run -------------------------------------------------------------------

# A learning rate that leaves the weights as they start: each step's loss is then its batch's, fixed by the data
# order (the seed), so that which checkpoint is the best is the same on every CPU. Trained (lr 0.02), it came down to
# the last digits of the arithmetic, and on one machine the newest was the best, leaving nothing older to keep.
RETENTION_ARGS = ("--epochs", "4", "--batch-size", "256", "--lr", "1e-9", "--seed", "1")


def test_retention_keeps_the_newest_and_the_best_and_every_sidecar_tells_the_truth(
    tmp_path: Path, ingest: ReportingServer
) -> None:
    # By the last step's loss, that of the checkpoint's last batch (RETENTION_ARGS): an older one is the best.
    started = time.time()
    run = train(
        tmp_path, *RETENTION_ARGS, "--keep-last", "1", "--keep-best", "1", "--best-metric", "loss",
        env=ingest.env(tmp_path / "run"),
    )  # fmt: skip
    run.assert_finished()
    losses, steps = ingest.losses(), SAMPLES_PER_RANK // 256
    written = [epoch * steps for epoch in range(1, 5)]
    assert sorted(losses) == list(range(1, 4 * steps + 1))
    # Deleting as it goes gives what deleting once at the end would: a checkpoint that was not among the best of
    # some set cannot be among the best of a larger one.
    best = min(written, key=lambda step: losses[step])
    assert best != written[-1], f"this seed no longer makes an older checkpoint the best: {losses}"
    kept = {best, written[-1]}

    assert names(run.folder) == {wire.RETENTION_LOG} | {
        name for step in kept for name in (wire.checkpoint_name(step), wire.sidecar_name(wire.checkpoint_name(step)))
    }
    for step in kept:
        path = run.folder / wire.checkpoint_name(step)
        snapshot, meta = torch.load(path, weights_only=True), read_sidecar(path)
        epoch = step // steps
        assert (meta.file, meta.step, meta.epoch) == (path.name, snapshot["step"], snapshot["epoch"])
        assert (meta.step, meta.epoch, meta.size) == (step, epoch, path.stat().st_size)
        assert meta.reason == ("final" if step == written[-1] else "epoch")
        assert started < meta.written_at < time.time()
        assert meta.metrics == snapshot["metrics"]
        assert meta.metrics["loss"] == losses[step]  # exactly what the dashboard plots at that step
        epoch_losses = [losses[s] for s in range((epoch - 1) * steps + 1, step + 1)]
        assert meta.metrics["epoch_loss"] == pytest.approx(sum(epoch_losses) / len(epoch_losses), rel=1e-12)

    records = [json.loads(line) for line in (run.folder / wire.RETENTION_LOG).read_text().splitlines()]
    assert sorted(r["removed"] for r in records) == sorted(wire.checkpoint_name(s) for s in written if s not in kept)
    for record in records:
        assert record["step"] == wire.checkpoint_step(record["removed"])
        assert record["policy"] == {"keep_last": 1, "keep_best": 1, "best_metric": "loss"}
        assert record["freed"] > 100_000 and started < record["at"] < time.time()
        assert f"[rank 0] removed {record['removed']}, freed {record['freed']} bytes" in run.log(0)


# --- one finished epoch, to break and to start from ---------------------------------------------------------------


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One epoch of 64 steps: a checkpoint `step-00000064.pt` and its sidecar."""
    run = train(tmp_path_factory.mktemp("first"), "--epochs", "1", "--batch-size", "512", "--seed", "3")
    run.assert_finished()
    return run


def first_checkpoint(run: Run) -> Path:
    [path] = run.folder.glob(wire.CHECKPOINT_GLOB)
    return path


# --- b. a checkpoint that cannot be written ---------------------------------------------------------------------


def test_a_checkpoint_too_big_to_write_fails_the_run_at_once_and_leaves_the_earlier_one_intact(
    first_run: Run, tmp_path: Path
) -> None:
    # Every checkpoint of a run is about the same size, so a file-size limit cannot let a first save through and
    # stop a later one. Instead, a second run writes into the first run's folder under a limit far below one
    # checkpoint (about 0.9 MB) and far above any log.
    folder = tmp_path / "checkpoints"
    shutil.copytree(first_run.folder, folder)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    limit = 256 * 1024
    assert len(first_checkpoint(first_run).read_bytes()) > 2 * limit
    # --resume false: a new run in that folder, rather than the continuation of the one whose files are there.
    run = train(tmp_path, "--epochs", "3", "--batch-size", "512", "--resume", "false", file_size_limit=limit)

    assert run.returncode != 0, run.output
    # A rank left waiting on rank 0 would hang until the 60 s process-group timeout; this run ends after its first
    # epoch. (A one-epoch run takes about 6 s here.)
    assert run.seconds < 30, run.output
    step = SAMPLES_PER_RANK // 512
    assert (
        f"[rank 0] checkpoint {wire.checkpoint_name(step)} NOT written: File too large (EFBIG); "
        "this run wrote none before it" in run.log(0, "stderr")
    )
    assert f"[rank 1] rank 0 could not write the checkpoint of step {step}; stopping" in run.log(1, "stderr")
    for rank in (0, 1):
        assert "Traceback" not in run.log(rank, "stderr"), run.log(rank, "stderr")
        assert "finished after" not in run.log(rank)
    assert not (tmp_path / "run" / wire.FINISHED_MARKER).exists()
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before  # nothing new, nothing changed
    assert torch.load(folder / first_checkpoint(first_run).name, weights_only=True)["step"] == step


@contextlib.contextmanager
def limited_file_size(limit: int) -> Iterator[None]:
    """In this process, for a moment: a write past `limit` bytes fails with EFBIG (rather than kill pytest)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # a soft limit may go back up to the hard one
        signal.signal(signal.SIGXFSZ, handler)


def snapshot_of(size: int) -> dict[str, Any]:
    return {"model": {"weight": torch.zeros(size)}, "epoch": 1, "step": 1}


def test_save_raises_the_write_error_with_its_errno_and_leaves_no_file(tmp_path: Path) -> None:
    metrics = {"loss": 1.0, "epoch_loss": math.nan}
    checkpoints.save(tmp_path, snapshot_of(100_000), epoch=1, step=1, metrics=metrics, reason="epoch")
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    with limited_file_size(64 * 1024), pytest.raises(OSError) as raised:  # torch.save says "unexpected pos"
        checkpoints.save(tmp_path, snapshot_of(100_000), epoch=2, step=2, metrics=metrics, reason="epoch")
    assert raised.value.errno == errno.EFBIG
    assert checkpoints.describe(raised.value) == "File too large (EFBIG)"
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before
    assert math.isnan(read_sidecar(tmp_path / "step-00000001.pt").metrics["epoch_loss"])
    assert '"epoch_loss": "NaN"' in (tmp_path / "step-00000001.json").read_text()


def test_a_sidecar_that_cannot_be_written_takes_its_checkpoint_with_it(tmp_path: Path) -> None:
    (tmp_path / "step-00000002.json").mkdir()  # os.replace onto a folder fails: IsADirectoryError
    with pytest.raises(IsADirectoryError):
        checkpoints.save(tmp_path, snapshot_of(10), epoch=1, step=2, metrics={"loss": 1.0}, reason="stop")
    assert names(tmp_path) == {"step-00000002.json"}


def test_every_reason_the_trainer_writes_is_one_the_dashboard_explains(tmp_path: Path) -> None:
    """The trainer writes "step" checkpoints (checkpoint_unit step), which wire.CHECKPOINT_REASONS once lacked."""
    for step, reason in enumerate(("epoch", "step", "stop", "final"), start=1):
        checkpoints.save(tmp_path, snapshot_of(10), epoch=1, step=step, metrics={"loss": 1.0}, reason=reason)
        assert read_sidecar(tmp_path / wire.checkpoint_name(step)).reason in wire.CHECKPOINT_REASONS
    with pytest.raises(ValueError, match="unknown checkpoint reason 'hourly'"):
        checkpoints.save(tmp_path, snapshot_of(10), epoch=1, step=9, metrics={"loss": 1.0}, reason="hourly")
    assert not (tmp_path / wire.checkpoint_name(9)).exists()


# --- c. starting from a checkpoint ------------------------------------------------------------------------------


def test_a_run_started_from_a_checkpoint_takes_its_first_step_with_its_weights(
    first_run: Run, tmp_path: Path, ingest: ReportingServer
) -> None:
    source = first_checkpoint(first_run)
    run = train(
        tmp_path, "--epochs", "1", "--batch-size", "512", "--seed", "5", "--init-from", str(source),
        env=ingest.env(tmp_path / "run"),
    )  # fmt: skip
    run.assert_finished()
    student = WORKLOADS["mlp"].build_model()
    student.load_state_dict(torch.load(source, weights_only=True)["model"])
    expected = first_step_loss(student, seed=5, batch_size=512)
    assert ingest.losses()[1] == pytest.approx(expected, rel=1e-5)
    torch.manual_seed(5)
    fresh = first_step_loss(WORKLOADS["mlp"].build_model(), seed=5, batch_size=512)
    assert expected < fresh - 1.0, "the checkpoint's weights are far better than a fresh start's"
    assert f"[rank 0] starting from the weights of {source} (its step 64)" in run.log(0)
    final = torch.load(first_checkpoint(run), weights_only=True)
    assert (final["step"], final["epoch"]) == (64, 1), "a new run counts from 0"
    assert {state["step"].item() for state in final["optimizer"]["state"].values()} == {64.0}, "fresh moments"


def test_init_optimizer_also_takes_the_moments_but_keeps_this_runs_learning_rate(
    first_run: Run, tmp_path: Path
) -> None:
    source = first_checkpoint(first_run)
    run = train(
        tmp_path, "--epochs", "1", "--batch-size", "512", "--lr", "0.002", "--init-from", str(source),
        "--init-optimizer", "true",
    )  # fmt: skip
    run.assert_finished()
    final = torch.load(first_checkpoint(run), weights_only=True)
    assert final["step"] == 64
    assert {state["step"].item() for state in final["optimizer"]["state"].values()} == {128.0}, "64 + 64 steps"
    assert final["optimizer"]["param_groups"][0]["lr"] == 0.002
    assert "[rank 0] starting from the weights and optimizer state of" in run.log(0)


def not_checkpoints(tmp: Path) -> dict[str, tuple[Path, str]]:
    """Files that are not checkpoints, with what the trainer must say about each."""
    torch.save(torch.zeros(3), tmp / "tensor.pt")
    (tmp / "notes.txt").write_text("loss went down\n")
    torch.save({"weights": {}}, tmp / "other.pt")
    return {
        "missing": (tmp / "nothing-here.pt", "no such file"),
        "tensor": (tmp / "tensor.pt", "not a Rankboard checkpoint (a Tensor, not a dict)"),
        "text": (tmp / "notes.txt", "not a Rankboard checkpoint (not a file torch.save writes)"),
        "other": (tmp / "other.pt", "not a Rankboard checkpoint (no 'model' key)"),
    }


@pytest.mark.parametrize("kind", ["missing", "tensor", "text"])
def test_a_bad_init_from_fails_every_rank_with_a_line_naming_the_file(kind: str, tmp_path: Path) -> None:
    path, reason = not_checkpoints(tmp_path)[kind]
    run = train(tmp_path / "run", "--epochs", "1", "--init-from", str(path))
    assert run.returncode != 0, run.output
    for rank in (0, 1):
        assert f"[rank {rank}] init_from {path}: {reason}\n" in run.log(rank, "stderr"), run.log(rank, "stderr")
        assert "Traceback" not in run.log(rank, "stderr")
        assert "training mlp" not in run.log(rank)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_init_from_names_every_way_a_file_can_be_wrong(first_run: Run, tmp_path: Path) -> None:
    def fails(path: Path, *, optimizer: bool = False) -> str:
        model = WORKLOADS["mlp"].build_model()
        adam = torch.optim.AdamW(model.parameters()) if optimizer else None
        with pytest.raises(checkpoints.CheckpointError) as raised:
            checkpoints.init_from(path, model, adam, torch.device("cpu"))
        return str(raised.value)

    for path, reason in not_checkpoints(tmp_path).values():
        assert fails(path) == f"init_from {path}: {reason}"
    snapshot = torch.load(first_checkpoint(first_run), weights_only=True)
    for name, model in [
        ("renamed", {f"layer.{key}": value for key, value in snapshot["model"].items()}),
        ("resized", {**snapshot["model"], "0.weight": torch.zeros(256, 16)}),
    ]:
        torch.save({**snapshot, "model": model}, tmp_path / f"{name}.pt")
        assert fails(tmp_path / f"{name}.pt").startswith(
            f"init_from {tmp_path / name}.pt: its model does not fit this workload's: RuntimeError: Error(s) in"
        )
    assert "size mismatch for 0.weight" in fails(tmp_path / "resized.pt")
    torch.save({"model": snapshot["model"]}, tmp_path / "weights-only.pt")
    assert fails(tmp_path / "weights-only.pt", optimizer=True).endswith(
        "no optimizer state ('optimizer' key), which init_optimizer needs"
    )
    assert fails(tmp_path).startswith(f"init_from {tmp_path}: cannot be read: Is a directory (EISDIR)")


# --- retention, in-process --------------------------------------------------------------------------------------


def sidecar(step: int, loss: float, epoch_loss: float = 0.0) -> wire.CheckpointSidecar:
    return wire.CheckpointSidecar(
        file=wire.checkpoint_name(step),
        step=step,
        epoch=step,
        metrics={"loss": loss, "epoch_loss": epoch_loss},
        size=10,
        written_at=0.0,
        reason="epoch",
    )


@pytest.mark.parametrize(
    ("keep_last", "keep_best", "best_metric", "kept"),
    [
        (0, 0, "loss", {1, 2, 3, 4, 5}),  # both 0: all
        (1, 0, "loss", {5}),
        (2, 0, "loss", {4, 5}),
        (0, 1, "loss", {2, 5}),  # the best, and the one just written though it is the worst
        (1, 1, "loss", {2, 5}),
        (1, 2, "loss", {2, 3, 5}),  # 3 ties with 4 at 0.3: the earlier wins
        (1, 1, "epoch_loss", {1, 5}),
        (1, 4, "epoch_loss", {1, 2, 3, 5}),  # a NaN is worse than any number
        (9, 9, "loss", {1, 2, 3, 4, 5}),
    ],
)
def test_the_policy_keeps_the_newest_and_the_best(
    keep_last: int, keep_best: int, best_metric: str, kept: set[int]
) -> None:
    written = [sidecar(1, 0.9, 0.1), sidecar(2, 0.2, 0.5), sidecar(3, 0.3, 0.4), sidecar(4, 0.3, math.nan)]
    written.append(sidecar(5, math.inf, 0.3))
    assert checkpoints.Policy(keep_last, keep_best, best_metric).kept(written) == kept


def test_retention_survives_files_deleted_by_hand_and_logs_every_removal(tmp_path: Path) -> None:
    said: list[str] = []
    retention = checkpoints.Retention(tmp_path, checkpoints.Policy(keep_last=1), said.append)
    for step in (1, 2, 3):
        (tmp_path / wire.checkpoint_name(step)).write_bytes(b"x" * 100)
        (tmp_path / wire.sidecar_name(wire.checkpoint_name(step))).write_text("{}")
    (tmp_path / "other-run.pt").write_bytes(b"x")
    retention.add(sidecar(1, 1.0))
    (tmp_path / wire.checkpoint_name(1)).unlink()  # by hand, before retention gets to it
    retention.add(sidecar(2, 1.0))
    retention.add(sidecar(3, 1.0))
    assert names(tmp_path) == {"other-run.pt", "step-00000003.pt", "step-00000003.json", wire.RETENTION_LOG}
    assert retention.latest == "step-00000003.pt"
    records = [json.loads(line) for line in (tmp_path / wire.RETENTION_LOG).read_text().splitlines()]
    assert [(r["removed"], r["step"], r["freed"]) for r in records] == [
        ("step-00000001.pt", 1, 2),
        ("step-00000002.pt", 2, 102),
    ]
    assert records[0]["policy"] == {"keep_last": 1, "keep_best": 0, "best_metric": "loss"}
    assert said[0] == "removed step-00000001.pt, freed 2 bytes: not among the newest 1 nor the best 0 by loss"


# --- d. the config and the wire ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("keep_last", -1),
        ("keep_last", 1.5),
        ("keep_last", True),
        ("keep_best", -1),
        ("keep_best", "2"),
        ("best_metric", "accuracy"),
        ("best_metric", ""),
        ("init_from", None),
        ("init_optimizer", "true"),
        ("init_optimizer", 1),
    ],
)
def test_a_bad_checkpoint_field_is_refused_by_name(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{name} "):
        TrainConfig(**{name: value})


def test_init_optimizer_needs_init_from() -> None:
    with pytest.raises(ValueError, match=r"^init_optimizer needs init_from"):
        TrainConfig(init_optimizer=True)


def test_the_checkpoint_flags_round_trip_and_read_as_the_server_writes_them() -> None:
    config = TrainConfig(keep_last=2, keep_best=3, best_metric="epoch_loss", init_from="/x/y.pt", init_optimizer=True)
    assert TrainConfig.from_argv(config.to_argv()) == config
    assert TrainConfig.from_argv(TrainConfig(init_from="/x/y.pt").to_argv()).init_optimizer is False
    server_argv = ["--keep-last", "2", "--keep-best", "3", "--best-metric", "epoch_loss", "--init-from", "/x/y.pt"]
    assert TrainConfig.from_argv([*server_argv, "--init-optimizer", "true"]) == config
    assert TrainConfig.from_argv([*server_argv, "--init-optimizer"]) == config
    assert TrainConfig.from_argv([*server_argv, "--init-optimizer", "false"]).init_optimizer is False
    assert TrainConfig.from_argv(["--init-from", ""]).init_from == ""


def test_a_bad_boolean_flag_exits_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        TrainConfig.from_argv(["--init-from", "a.pt", "--init-optimizer", "maybe"])
    assert exit_info.value.code == 2
    assert "argument --init-optimizer: expected true or false, got 'maybe'" in capsys.readouterr().err


def test_checkpoint_names_and_steps() -> None:
    assert wire.checkpoint_name(512) == "step-00000512.pt"
    assert wire.sidecar_name("step-00000512.pt") == "step-00000512.json"
    assert wire.checkpoint_step("step-00000512.pt") == wire.checkpoint_step("step-00000512.json") == 512
    for other in [
        ".step-00000512.pt.123.abcd1234.tmp",
        "step-.pt",
        "step-12a.pt",
        "step-1.pt.json",
        "x.pt",
        "step-١.pt",
    ]:
        assert wire.checkpoint_step(other) is None, other


def test_a_sidecar_round_trips_through_json_and_anything_else_is_refused() -> None:
    written = sidecar(64, math.nan, math.inf)
    body = json.loads(json.dumps(written.to_json(), allow_nan=False))
    assert body["metrics"] == {"loss": "NaN", "epoch_loss": "Infinity"}
    again = wire.CheckpointSidecar.from_json(body)
    assert math.isnan(again.metrics["loss"]) and again.metrics["epoch_loss"] == math.inf
    assert again.file == written.file and again.step == written.step and again.reason == written.reason
    for bad in [
        [],
        {},
        {**body, "step": "x"},
        {**body, "metrics": [1]},
        {**body, "step": 65},
        {**body, "file": "a.pt"},
    ]:
        with pytest.raises(ValueError, match=r"^not a checkpoint sidecar"):
            wire.CheckpointSidecar.from_json(bad)
