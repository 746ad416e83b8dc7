"""Comparing 2 to 10 runs: their options side by side, a summary of each, and a chart of every metric any of them has.

The charts are the run page's (`run_charts.layout`, called with the union of the runs' keys): the same sections, the
same charts, the same ids. Each chart draws a line per run and rank, and says which runs have none of its keys; those
runs' lines are not asked for."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from app.core.errors import FieldInvalid
from app.core.models import MetricSummary, Run
from app.core.option_text import option_text
from app.core.trainer_options import OPTION_NAMES
from app.launcher.launchers import kind
from app.schemas.runs import RunCreate
from app.schemas.runs_table import ComparedMetricOut, ComparedOptionOut, ComparedRunOut, CompareOut
from app.services import runs
from app.services.run_charts import Chart, ChartSection, layout, section_of
from app.store import metrics as metric_store
from app.store import runs_table as table_store
from app.store.runs_table_query import NOT_COLUMNS, STATS

MIN_RUNS, MAX_RUNS = 2, 10
# Above this many options, the table shows only those that differ unless asked for all: 44 rows, most of them the
# same Slurm defaults, hid the two that mattered.
OPTIONS_SHOWN_WHOLE = 10
SUMMARY_KEYS = 20  # the page's summary rows of metrics, in the charts' order; every key still has its chart
# Left out of the page's summary: a row per GPU field per device, or the goodput ledger's running sums, would crowd
# out the metrics a user compares runs by; their charts show them.
SUMMARY_LEAVES_OUT = {"gpu", "sys", "goodput", "forensics"}


@dataclass(frozen=True)
class OptionRow:
    """One option across the runs: each run's value as the form shows it, and whether they differ."""

    name: str
    values: list[str]
    differs: bool


@dataclass(frozen=True)
class ComparedChart:
    """A run-page chart over the compared runs: the keys each run lacks (`absent`, its lines are not asked for),
    and the sentences that say so under its title."""

    chart: Chart
    absent: dict[int, list[str]]  # run id -> the chart's keys it never reported; only runs that lack one
    lacking: list[str]

    def to_json(self) -> dict[str, Any]:
        """The chart's spec as the run page has it, with `absent` for static/charts/chart.js."""
        return {**self.chart.to_json(), "absent": {str(run_id): keys for run_id, keys in self.absent.items()}}


@dataclass(frozen=True)
class ComparedSection:
    section: ChartSection
    charts: list[ComparedChart]


@dataclass(frozen=True)
class Comparison:
    runs: list[Run]
    options: list[OptionRow]
    keys: list[str]  # every metric key any of the runs has, in the charts' order
    summaries: dict[tuple[int, str], MetricSummary]
    durations: dict[int, timedelta | None]
    sections: list[ComparedSection]
    silent: list[Run]  # the runs with no metric at all: said once above the charts, not under each

    @property
    def labels(self) -> list[dict[str, object]]:
        """What the charts need of each run: its id, its lines' label, when it started, whether it is still going."""
        return [{"id": run.id, "label": f"#{run.id}", "origin": _started(run), "live": not run.status.is_final}
                for run in self.runs]  # fmt: skip

    @property
    def live(self) -> bool:
        return any(not run.status.is_final for run in self.runs)

    @property
    def differing(self) -> int:
        return sum(row.differs for row in self.options)

    @property
    def summary_keys(self) -> list[str]:
        return [key for key in self.keys if section_of(key) not in SUMMARY_LEAVES_OUT][:SUMMARY_KEYS]

    def only_differing(self, asked: str | None) -> bool:
        """Whether the options table shows only the rows that differ: as asked ("differ" or "all"), else when long."""
        return asked == "differ" if asked in ("differ", "all") else len(self.options) > OPTIONS_SHOWN_WHOLE


def compare(db: Session, *, run_ids: Sequence[int]) -> Comparison:
    """The runs in the order given; FieldInvalid unless 2 to 10 different runs."""
    ids = list(dict.fromkeys(run_ids))
    if not MIN_RUNS <= len(ids) <= MAX_RUNS:
        raise FieldInvalid("run", f"run: compare {MIN_RUNS} to {MAX_RUNS} different runs, not {len(ids)}")
    found = [runs.get_run(db, run_id=run_id) for run_id in ids]
    options = [OptionRow(name, values, len(set(values)) > 1) for name, values in _options(found)]
    present = {run_id: set(metric_store.series_keys(db, run_id=run_id)) for run_id in ids}
    sections = _sections(found, present)
    keys = [key for s in sections for c in s.charts for key in c.chart.keys]
    summaries = table_store.summaries(db, run_ids=ids, keys=keys)
    durations = {run.id: runs.elapsed(run) for run in found}
    silent = [run for run in found if not present[run.id]]
    return Comparison(found, options, keys, summaries, durations, sections, silent)


def _started(run: Run) -> float:
    """Where the run's "time since start" counts from, as on its own page."""
    return (run.started_at or run.created_at).timestamp()


def _sections(found: list[Run], present: dict[int, set[str]]) -> list[ComparedSection]:
    """The run page's sections for the union of the runs' keys; GPU and host charts start at the earliest run."""
    union = set().union(*present.values())
    start = min(int(run.created_at.timestamp()) for run in found)
    return [
        ComparedSection(section, [_compared(chart, found, present) for chart in section.charts])
        for section in layout(union, time_start=start)
    ]


def _compared(chart: Chart, found: list[Run], present: dict[int, set[str]]) -> ComparedChart:
    """Which runs lack the chart's keys, and the sentences that say so: a run with none of them is named as such (a
    run with no metric at all is said once for the page); one with some is named with the keys it lacks, except on
    GPU and host charts, where runs on other hosts would each lack the others' devices."""
    absent = {run.id: [key for key in chart.keys if key not in present[run.id]] for run in found}
    absent = {run_id: keys for run_id, keys in absent.items() if keys}
    names = {run.id: f"#{run.id} {run.name}" for run in found}
    lacking = [names[run_id] for run_id, keys in absent.items() if len(keys) == len(chart.keys) and present[run_id]]
    sentences = [f"Not reported by {', '.join(lacking)}"] if lacking else []
    if not chart.time:
        sentences += [f"{names[run_id]} has no {', '.join(keys)}" for run_id, keys in absent.items()
                      if len(keys) < len(chart.keys)]  # fmt: skip
    return ComparedChart(chart, absent, sentences)


def _options(found: list[Run]) -> list[tuple[str, list[str]]]:
    """Each run's value of its own columns, then of every key in the runs' config documents (the trainer's options in
    their order, then what scripts reported, as they named it), as the form writes it; "" where a run has none. A
    scheduler's options (`slurm_*`) only where one of the runs went through it: on local runs they are all unset."""
    scheduled = any(kind(run.launcher).scheduler for run in found)
    columns = ["name", *(name for name in RunCreate.model_fields if name not in {*NOT_COLUMNS, *OPTION_NAMES, "name"}
                         and (scheduled or not name.startswith("slurm_")))]  # fmt: skip
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
