"""Comparing 2 to 10 runs: their options side by side, the metrics they have in common, and a summary of each."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.orm import Session

from app.core.errors import FieldInvalid
from app.core.models import MetricSummary, Run
from app.core.option_text import option_text
from app.core.trainer_options import OPTION_NAMES
from app.schemas.runs import RunCreate
from app.schemas.runs_table import ComparedMetricOut, ComparedOptionOut, ComparedRunOut, CompareOut
from app.services import runs
from app.store import metrics as metric_store
from app.store import runs_table as table_store
from app.store.runs_table_query import NOT_COLUMNS, STATS

MIN_RUNS, MAX_RUNS = 2, 10


@dataclass(frozen=True)
class OptionRow:
    """One option across the runs: each run's value as the form shows it, and whether they differ."""

    name: str
    values: list[str]
    differs: bool


@dataclass(frozen=True)
class Comparison:
    runs: list[Run]
    options: list[OptionRow]
    keys: list[str]  # the metric keys every one of the runs has
    summaries: dict[tuple[int, str], MetricSummary]
    durations: dict[int, timedelta | None]

    @property
    def labels(self) -> list[dict[str, object]]:
        """Each run's id and the label of its lines on the charts."""
        return [{"id": run.id, "label": f"#{run.id} {run.name}"} for run in self.runs]

    @property
    def live(self) -> bool:
        return any(not run.status.is_final for run in self.runs)


def compare(db: Session, *, run_ids: Sequence[int]) -> Comparison:
    """The runs in the order given; FieldInvalid unless 2 to 10 different runs."""
    ids = list(dict.fromkeys(run_ids))
    if not MIN_RUNS <= len(ids) <= MAX_RUNS:
        raise FieldInvalid("run", f"run: compare {MIN_RUNS} to {MAX_RUNS} different runs, not {len(ids)}")
    found = [runs.get_run(db, run_id=run_id) for run_id in ids]
    options = [OptionRow(name, values, len(set(values)) > 1) for name, values in _options(found)]
    keys = set(metric_store.series_keys(db, run_id=ids[0]))
    for run_id in ids[1:]:
        keys &= set(metric_store.series_keys(db, run_id=run_id))
    common = sorted(keys)
    summaries = table_store.summaries(db, run_ids=ids, keys=common)
    return Comparison(found, options, common, summaries, {run.id: runs.elapsed(run) for run in found})


def _options(found: list[Run]) -> list[tuple[str, list[str]]]:
    """Each run's value of its own columns, then of every key in the runs' config documents (the trainer's options in
    their order, then what scripts reported, as they named it), as the form writes it; "" where a run has none."""
    columns = ["name", *(name for name in RunCreate.model_fields if name not in {*NOT_COLUMNS, *OPTION_NAMES, "name"})]
    documents = [run.config or {} for run in found]
    keys = [name for name in OPTION_NAMES if any(name in document for document in documents)]
    keys += list(dict.fromkeys(key for document in documents for key in document if key not in OPTION_NAMES))
    rows = [(name, [getattr(run, name) for run in found]) for name in [*columns, "nccl_env"]]
    rows += [(key, [document.get(key) for document in documents]) for key in keys]
    return [(name, [_text(value) for value in values]) for name, values in rows]


def _text(value: object) -> str:
    nested = isinstance(value, dict | list) and any(isinstance(v, dict | list) for v in _items(value))
    return json.dumps(value) if nested else option_text(value)


def _items(value: dict[str, object] | list[object]) -> list[object]:
    return list(value.values()) if isinstance(value, dict) else list(value)


def compare_out(db: Session, *, run_ids: Sequence[int]) -> CompareOut:
    """`compare`, as the API answers it."""
    found = compare(db, run_ids=run_ids)
    compared = [
        ComparedRunOut(id=run.id, name=run.name, status=run.status, step=run.step, total_steps=run.total_steps,
                       duration_s=duration.total_seconds() if (duration := found.durations[run.id]) else None,
                       tags=run.tags)
        for run in found.runs
    ]  # fmt: skip
    options = [ComparedOptionOut(name=row.name, values=row.values, differs=row.differs) for row in found.options]
    return CompareOut(runs=compared, options=options, metrics=[_metric(found, key) for key in found.keys])


def _metric(found: Comparison, key: str) -> ComparedMetricOut:
    summaries = [found.summaries.get((run.id, key)) for run in found.runs]
    last, low, high = ([getattr(s, f"{stat}_value") if s else None for s in summaries] for stat in STATS)
    return ComparedMetricOut(key=key, last=last, min=low, max=high)
