"""MLflow's runs as source runs, read through MLflow's own client (`MlflowClient`) from any tracking URI it takes: a
SQLite or other database store (`sqlite:///mlflow.db`), an `mlruns` folder, or a tracking server.

Each run brings every value of every metric with its step and time; its parameters as the config (MLflow keeps
them as text: numbers and flags are turned back into numbers and flags, so that the runs table filters on them);
its own tags as tags (`key:value`), with its experiment's name as `experiment:<name>`; its note as the notes; and
its status as its ending. Artifacts (files, models) and dataset inputs are counted and skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlflow.entities import Experiment, Run, ViewType
from mlflow.tracking import MlflowClient

from . import Point, Reading, SourceRun, Unreadable, fitting_config, fitting_tags, read_safely, typed

_PAGE = 1000
_NOTE = "mlflow.note.content"
_SYSTEM_TAGS = "mlflow."  # MLflow's own tags (user, source, git commit, run name): not the user's labels
_ENDINGS = {"FINISHED": ("finished", None), "FAILED": ("failed", "MLflow says the run FAILED"),
            "KILLED": ("failed", "MLflow says the run was KILLED")}  # fmt: skip


def tracking_uri(where: str) -> str:
    """A tracking URI as MLflow takes it; a path to a database file is a SQLite store."""
    path = Path(where)
    if "://" not in where and path.is_file():
        return f"sqlite:///{path.resolve()}"
    return where


def runs(where: str, experiment: str | None = None) -> Iterator[SourceRun | Unreadable]:
    """Every active run of every active experiment (or of the one named), oldest experiment first."""
    client = MlflowClient(tracking_uri=tracking_uri(where))
    for found in _experiments(client, experiment):
        token = None
        while True:
            page = client.search_runs([found.experiment_id], run_view_type=ViewType.ACTIVE_ONLY, max_results=_PAGE,
                                      order_by=["attributes.start_time ASC"], page_token=token)  # fmt: skip
            for run in page:
                yield read_safely(run.info.run_name or run.info.run_id, lambda: _source_run(client, found, run))  # noqa: B023
            token = page.token
            if not token:
                break


def _experiments(client: MlflowClient, name: str | None) -> Iterator[Experiment]:
    token = None
    where = f"name = '{name}'" if name else None
    while True:
        page = client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=_PAGE, filter_string=where,
                                         order_by=["creation_time ASC"], page_token=token)  # fmt: skip
        yield from page
        token = page.token
        if not token:
            return


def _source_run(client: MlflowClient, experiment: Experiment, run: Run) -> SourceRun:
    info, data = run.info, run.data
    noted: Counter[str] = Counter()
    config = fitting_config({key: typed(value) for key, value in data.params.items()}, noted)
    labels = [f"experiment:{experiment.name}"]
    labels += [
        f"{key}:{value}" if value else key for key, value in data.tags.items() if not key.startswith(_SYSTEM_TAGS)
    ]
    tags = fitting_tags(labels, noted)
    ending, error = _ENDINGS.get(info.status, ("exited", None))
    keys = sorted(data.metrics)

    def read(reading: Reading) -> Iterator[Point]:
        reading.skipped.update(noted)
        for key in keys:
            for metric in client.get_metric_history(info.run_id, key):
                yield key, metric.step, metric.value, metric.timestamp / 1000
            reading.done += 1
        _count_left_out(client, run, reading)

    return SourceRun(key=f"mlflow:{info.run_id}", name=info.run_name or info.run_id, config=config, read=read,
                     total=len(keys), tags=tags, notes=data.tags.get(_NOTE, ""), ending=ending,
                     error=error)  # fmt: skip


def _count_left_out(client: MlflowClient, run: Run, reading: Reading) -> None:
    try:
        artifacts = client.list_artifacts(run.info.run_id)
    except Exception as error:  # an artifact store this machine cannot reach (S3 without credentials) says little
        reading.skipped[f"artifacts that could not be listed ({type(error).__name__})"] += 1
    else:
        if artifacts:
            reading.skipped["artifacts (files, models): Rankboard imports metrics, parameters and tags"] += len(
                artifacts
            )
    inputs: Any = getattr(run, "inputs", None)
    datasets = len(getattr(inputs, "dataset_inputs", None) or [])
    if datasets:
        reading.skipped["dataset inputs: Rankboard imports metrics, parameters and tags"] += datasets
