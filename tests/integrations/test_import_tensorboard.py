"""`rankboard import tensorboard DIR` against logs written by PyTorch's SummaryWriter, checked point for point
against what TensorBoard's own reader reads from them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from rankboard.client import Client
from rankboard.importers import Reading, tensorboard
from rankboard.importers.upload import Uploader
from tensorboard.backend.event_processing import event_accumulator
from torch.utils.tensorboard import SummaryWriter

from tests.integrations.conftest import imported, runs_by_key, series
from tests.live import LiveServer


def write_log(folder: Path, steps: int = 20) -> None:
    """What a PyTorch training script writes: scalars, a group of scalars, hyperparameters, and the things that are
    no scalars (an image, a histogram, text)."""
    writer = SummaryWriter(str(folder))
    for step in range(steps):
        writer.add_scalar("train/loss", 1 / (step + 1), step)
        writer.add_scalars("acc", {"train": step / steps, "val": step / (2 * steps)}, step)
    writer.add_image("sample", np.zeros((3, 4, 4)), 0)
    writer.add_histogram("weights", np.arange(10.0), 0)
    writer.add_text("notes", "a first try", 0)
    writer.add_hparams({"lr": 0.001, "optimizer": "adamw", "layers": 4}, {"hparam/best_acc": 0.5})
    writer.close()


def tensorboards_scalars(folder: Path) -> dict[str, list[tuple[int, float, float]]]:
    """(step, value, wall time) of every scalar series, as TensorBoard itself reads them."""
    accumulator = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    return {tag: [(s.step, s.value, s.wall_time) for s in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}  # fmt: skip


def test_every_scalar_comes_with_its_step_and_time_and_the_hyperparameters_as_config(
    server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_log(tmp_path / "logs" / "baseline")
    code, out, _ = imported(server, capsys, "tensorboard", tmp_path / "logs", "--tag", "from-tb")
    assert code == 0, out
    [run] = [r for r in runs_by_key(server).values() if r["name"] == "baseline"]
    assert run["status"] == "succeeded" and run["launcher"] == "external"
    assert run["config"] == {"lr": 0.001, "optimizer": "adamw", "layers": 4}
    assert run["tags"] == ["from-tb"]
    ours = tensorboards_scalars(tmp_path / "logs" / "baseline")
    assert series(server, run["id"], "train/loss") == ours["train/loss"]
    # add_scalars writes each series into a folder of its own, acc_train/ and acc_val/, which TensorBoard shows as
    # runs of their own: here they are the run's acc/train and acc/val.
    assert series(server, run["id"], "acc/train") == tensorboards_scalars(tmp_path / "logs/baseline/acc_train")["acc"]
    assert len(series(server, run["id"], "acc/val")) == 20
    assert [p[1] for p in series(server, run["id"], "hparam/best_acc")] == [0.5]
    for reason in ("images: Rankboard stores scalars", "histograms: Rankboard stores scalars", "text: Rankboard"):
        assert reason in out


def test_a_second_import_stores_nothing_twice(server: LiveServer, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    write_log(tmp_path / "again")
    assert imported(server, capsys, "tensorboard", tmp_path / "again")[0] == 0
    before = runs_by_key(server)
    code, out, _ = imported(server, capsys, "tensorboard", tmp_path / "again")
    assert code == 0 and "imported 0 runs" in out and "1 imported before" in out
    assert runs_by_key(server) == before  # the same runs, none reopened
    [run] = [r for r in before.values() if r["name"] == "again"]
    assert len(series(server, run["id"], "train/loss")) == 20


def test_an_import_cut_short_is_finished_by_the_next(server: LiveServer, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    writer = SummaryWriter(str(tmp_path / "long"))
    for step in range(25_000):  # three batches of the ingest endpoint's 10,000 points
        writer.add_scalar("loss", 1 / (step + 1), step)
    writer.close()
    [source] = tensorboard.runs(tmp_path / "long")
    assert not isinstance(source, tensorboard.Unreadable)

    def interrupt() -> None:
        raise KeyboardInterrupt  # Ctrl-C after the first batch

    with pytest.raises(KeyboardInterrupt):
        Uploader(Client(server.url)).upload(source, Reading(), interrupt)
    cut = runs_by_key(server)[source.key]
    assert cut["status"] != "succeeded" and len(series(server, cut["id"], "loss")) == 10_000
    code, out, _ = imported(server, capsys, "tensorboard", tmp_path / "long")
    assert code == 0 and "25,000 points, 15,000 of them new" in out
    done = runs_by_key(server)[source.key]
    assert (done["id"], done["status"]) == (cut["id"], "succeeded")
    assert [p[0] for p in series(server, done["id"], "loss")] == list(range(25_000))


def test_a_damaged_run_is_said_and_the_others_are_imported(server: LiveServer, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    write_log(tmp_path / "mixed" / "good", steps=3)
    (tmp_path / "mixed" / "bad").mkdir()
    record = b"\x05" + b"\x00" * 11 + b"junk!" + b"\x00" * 4  # a whole record, whose data is no event
    (tmp_path / "mixed" / "bad" / "events.out.tfevents.1.host.1.0").write_bytes(record)
    code, out, _ = imported(server, capsys, "tensorboard", tmp_path / "mixed")
    assert code == 1
    assert "run " in out and "good" in out and "not imported: bad:" in out


def test_without_the_tensorboard_package_the_command_says_what_to_install(
    server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m.startswith(("tensorboard", "rankboard.importers.tensorboard"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # an import of it fails, as where it is not installed
    code, _, err = imported(server, capsys, "tensorboard", tmp_path)
    assert code == 1 and "pip install 'rankboard[import]'" in err
