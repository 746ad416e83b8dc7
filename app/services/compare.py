"""Comparing 2 to 10 runs: their options side by side, the metrics they have in common, and a summary of each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.orm import Session

from app.core.errors import FieldInvalid
from app.core.models import MetricSummary, Run
from app.schemas.runs import RunCreate
from app.schemas.runs_table import ComparedMetricOut, ComparedOptionOut, ComparedRunOut, CompareOut
from app.services import runs
from app.services.runs_table_query import NOT_COLUMNS, STATS
from app.store import metrics as metric_store
from app.store import runs_table as table_store
from app.web.forms import as_form_text

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
    names = ["name", *(name for name in RunCreate.model_fields if name not in NOT_COLUMNS | {"name"})]
    names += ["nccl_env", "script_args"]
    options = []
    for name in names:
        values = [as_form_text({name: getattr(run, name)}).get(name, "") for run in found]
        options.append(OptionRow(name, values, len(set(values)) > 1))
    keys = set(metric_store.series_keys(db, run_id=ids[0]))
    for run_id in ids[1:]:
        keys &= set(metric_store.series_keys(db, run_id=run_id))
    common = sorted(keys)
    summaries = table_store.summaries(db, run_ids=ids, keys=common)
    return Comparison(found, options, common, summaries, {run.id: runs.elapsed(run) for run in found})


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
