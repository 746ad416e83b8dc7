"""`rankboard import wandb DIR` against runs that W&B itself wrote in offline mode (WANDB_MODE=offline: no network)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import wandb

from tests.integrations.conftest import imported, runs_by_key, series
from tests.live import LiveServer


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project folder whose wandb/ holds two offline runs: one that finished, with config, tags, notes, numbers
    (nested too), media and text; one that exited with an error."""
    folder = tmp_path_factory.mktemp("project")
    saved = {name: os.environ.get(name) for name in ("WANDB_MODE", "WANDB_SILENT", "WANDB_DIR")}
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    try:
        run = wandb.init(project="llm", name="warm-start", dir=folder, config={"lr": 3e-4, "model": {"layers": 12}},
                         tags=["baseline"], notes="first try", group="sweep-1")  # fmt: skip
        for step in range(40):
            run.log({"loss": 1 / (step + 1), "eval": {"acc": step / 40}}, step=step)
        run.log({"sample": wandb.Image(np.zeros((4, 4, 3), dtype=np.uint8)), "weights": wandb.Histogram([1, 2]),
                 "comment": "halfway"}, step=40)  # fmt: skip
        run.summary["best_acc"] = 0.9  # set, never logged
        run.finish()
        crashed = wandb.init(project="llm", name="crashed", dir=folder)
        crashed.log({"loss": 5.0})
        crashed.finish(exit_code=3)
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    return folder


def test_offline_runs_come_with_config_tags_notes_ending_and_every_number_logged(
    server: LiveServer, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = imported(server, capsys, "wandb", project)
    assert code == 0, out
    runs = {run["name"]: run for key, run in runs_by_key(server).items() if key.startswith("wandb:")}
    assert sorted(runs) == ["crashed", "warm-start"]
    warm = runs["warm-start"]
    assert warm["config"] == {"lr": 3e-4, "model": {"layers": 12}}
    assert sorted(warm["tags"]) == ["baseline", "group:sweep-1", "project:llm"]
    assert (warm["notes"], warm["status"]) == ("first try", "succeeded")
    loss = series(server, warm["id"], "loss")
    assert [(step, value) for step, value, _ in loss] == [(step, 1 / (step + 1)) for step in range(40)]
    assert all(when > 1.7e9 for _, _, when in loss)  # the wall time W&B kept, not the import's
    assert [value for _, value, _ in series(server, warm["id"], "eval/acc")] == [step / 40 for step in range(40)]
    assert runs["crashed"]["status"] == "failed" and "code 3" in runs["crashed"]["status_reason"]
    assert "media and objects (images, histograms, tables...)" in out
    assert "text and other values that are no number" in out
    assert "summary values never logged as history" in out


def test_a_second_import_of_the_run_folder_alone_stores_nothing(
    server: LiveServer, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = sorted((project / "wandb").glob("offline-run-*"))[0]
    imported(server, capsys, "wandb", folder)
    before = runs_by_key(server)
    code, out, _ = imported(server, capsys, "wandb", folder)
    assert code == 0 and "imported 0 runs" in out and runs_by_key(server) == before
