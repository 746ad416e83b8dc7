"""`rankboard import mlflow URI` against a SQLite store written by MLflow itself, checked against what MLflow's own
client reads from it."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from tests.integrations.conftest import imported, runs_by_key, series
from tests.live import LiveServer


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two experiments: a finished run with parameters, tags, a note, metrics at steps and an artifact; a failed one;
    and a run in a second experiment."""
    folder = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=mlflow.create_experiment("vision", artifact_location=str(folder / "a1")))
    with mlflow.start_run(run_name="resnet-lr3"):
        mlflow.log_params({"lr": 0.001, "optimizer": "adamw", "layers": 50, "amp": True})
        mlflow.set_tags({"team": "vision", "baseline": ""})
        mlflow.set_tag("mlflow.note.content", "the first try")
        for step in range(30):
            mlflow.log_metric("loss", 1 / (step + 1), step=step)
            mlflow.log_metric("val/acc", step / 30, step=step)
        mlflow.log_text("a report", "report.txt")
    with mlflow.start_run(run_name="diverged"):
        mlflow.log_metric("loss", float("nan"), step=7)
        mlflow.end_run(status="FAILED")
    mlflow.set_experiment(experiment_id=mlflow.create_experiment("text", artifact_location=str(folder / "a2")))
    with mlflow.start_run(run_name="bert"):
        mlflow.log_metric("loss", 2.0, step=0)
    mlflow.set_tracking_uri("")
    return uri


def mlflow_history(uri: str, run_id: str, key: str) -> list[tuple[int, float, float]]:
    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)
    return sorted((m.step, m.value, m.timestamp / 1000) for m in history)


def test_runs_come_with_their_params_tags_note_status_and_every_metric_value(
    server: LiveServer, store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = imported(server, capsys, "mlflow", store)
    assert code == 0, out
    runs = {run["name"]: run for key, run in runs_by_key(server).items() if key.startswith("mlflow:")}
    assert sorted(runs) == ["bert", "diverged", "resnet-lr3"]
    resnet = runs["resnet-lr3"]
    # Parameters are text in MLflow; numbers and flags come back as such, so that `lr < 1e-2` finds the run.
    assert resnet["config"] == {"lr": 0.001, "optimizer": "adamw", "layers": 50, "amp": True}
    assert sorted(resnet["tags"]) == ["baseline", "experiment:vision", "team:vision"]
    assert resnet["notes"] == "the first try" and resnet["status"] == "succeeded"
    run_id = resnet["external_key"].removeprefix("mlflow:")
    for key in ("loss", "val/acc"):
        assert series(server, resnet["id"], key) == mlflow_history(store, run_id, key)
    assert runs["diverged"]["status"] == "failed" and "FAILED" in runs["diverged"]["status_reason"]
    [(step, value, _)] = series(server, runs["diverged"]["id"], "loss")
    assert (step, value) == (7, "NaN")  # stored as NaN, which the API writes as the string JSON allows
    assert "artifacts (files, models)" in out


def test_one_experiment_alone_and_never_twice(server: LiveServer, store: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, out, _ = imported(server, capsys, "mlflow", store, "--experiment", "text")
    assert code == 0
    assert "bert" in out and "resnet" not in out
    before = runs_by_key(server)
    code, out, _ = imported(server, capsys, "mlflow", store, "--experiment", "text")
    assert "imported 0 runs" in out and runs_by_key(server) == before
