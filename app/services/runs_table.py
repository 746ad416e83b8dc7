"""The runs table and what a user does to many runs at once: find them, tag them, note on them, archive them."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import delete
from sqlalchemy.orm import Session

from app.core.errors import FieldInvalid
from app.core.models import Run, RunTag, utcnow
from app.services import runs
from app.store import audit
from app.store import runs_table as table_store
from app.store.runs_table_query import RunQuery, Target, config_path

TAG = re.compile(r"^[\w.:+/-]{1,64}$")
MAX_TAGS = 50
MAX_NOTES = 10_000
MAX_BULK = 500
Value = float | str | bool | None
BulkAction = Literal["tag", "untag", "archive", "unarchive"]
LOSS_KEYS = ("loss", "train/loss", "train_loss")  # a run's sparkline is of the first of these it has
SPARK_POINTS = 40


@dataclass(frozen=True)
class Sparkline:
    """A run's loss over its steps, small: each point's x and y from 0 to 1 (y up), and the values at its ends."""

    key: str
    points: tuple[tuple[float, float], ...]
    first: float
    last: float


@dataclass(frozen=True)
class RunsTable:
    """One page of the runs table: its runs, how many match, and each run's value of each asked-for column."""

    runs: Sequence[Run]
    total: int
    query: RunQuery
    values: dict[int, dict[str, Value]]
    sparklines: dict[int, Sparkline]  # by run, of those that have a loss of two buckets or more; empty unless asked


def page(db: Session, *, query: RunQuery, limit: int, offset: int, sparklines: bool = False) -> RunsTable:
    """The runs the query finds, sorted and paged, with their column values (metrics from their summaries) and, if
    asked, each one's loss sparkline (one query for the page)."""
    _check_metrics_reported(db, query)
    found, total = table_store.page(db, query, limit=limit, offset=offset)
    metrics = [column.metric for column in query.columns if column.metric is not None]
    summaries = table_store.summaries(db, run_ids=[run.id for run in found], keys=metrics)
    values: dict[int, dict[str, Value]] = {}
    for run in found:
        row: dict[str, Value] = {}
        for column in query.columns:
            if column.config is not None:
                row[column.label] = _scalar(_at(run.config, column.config))
            elif column.field is not None:
                row[column.label] = _scalar(getattr(run, column.field))
            else:
                summary = summaries.get((run.id, column.metric or ""))
                row[column.label] = None if summary is None else getattr(summary, f"{column.stat}_value")
        values[run.id] = row
    lines = loss_sparklines(db, run_ids=[run.id for run in found]) if sparklines else {}
    return RunsTable(found, total, query, values, lines)


def loss_sparklines(db: Session, *, run_ids: Sequence[int]) -> dict[int, Sparkline]:
    """Each run's loss sparkline (of the first of LOSS_KEYS it has with two points or more), from its tier rows."""
    read = table_store.sparklines(db, run_ids=run_ids, keys=LOSS_KEYS, points=SPARK_POINTS)
    lines = {series: [(step, value) for step, value in line if math.isfinite(value)] for series, line in read.items()}
    found = {}
    for run_id in run_ids:
        key = next((key for key in LOSS_KEYS if len(lines.get((run_id, key), ())) >= 2), None)
        if key is not None:
            found[run_id] = _scaled(key, lines[(run_id, key)])
    return found


def _scaled(key: str, line: list[tuple[int, float]]) -> Sparkline:
    steps, values = [step for step, _ in line], [value for _, value in line]
    low, high = min(values), max(values)
    width, height = (steps[-1] - steps[0]) or 1, (high - low) or 1
    points = tuple(((step - steps[0]) / width, (value - low) / height) for step, value in line)
    return Sparkline(key, points, values[0], values[-1])


def _check_metrics_reported(db: Session, query: RunQuery) -> None:
    """A name that is no field and no metric of any run, while runs have reported others, is a typo (`-val_los`),
    refused naming it, rather than a table sorted by, or filtered on, nothing. On a store with no metrics yet there
    is nothing to tell a typo by: a view bookmarked elsewhere (`-loss.min`) still shows its empty table."""
    named = _named(query)
    _check_config_keys(db, named)
    metrics = [(param, aim.metric) for param, aim in named if aim.metric is not None]
    known = table_store.reported_keys(db, keys=sorted({metric for _param, metric in metrics}))
    for param, metric in metrics:  # a script's own config key, named without `config.`: say how to name it
        path = None if metric in known else config_path(metric)
        if path is not None and table_store.config_keys(db, paths=[path]):
            said = f"{param}: {metric!r} is no field of a run, and no run has a metric of that name"
            raise FieldInvalid(param, f"{said}; runs' config has it: config.{metric}")
    if metrics and not known and not table_store.any_reported(db):
        return
    for param, metric in metrics:
        if metric not in known:
            raise FieldInvalid(param, f"{param}: {metric!r} is no field of a run, and no run has a metric of that name")


def _named(query: RunQuery) -> list[tuple[str, Target]]:
    """What the query names, each with the parameter that named it."""
    named = [("sort", query.sort), *(("filter", c.target) for c in query.conditions)]
    return named + [("columns", column) for column in query.columns]


def _check_config_keys(db: Session, named: list[tuple[str, Target]]) -> None:
    """A `config.<key>` that no run's config has, while there are runs, is a typo too."""
    keys = [(param, aim.config) for param, aim in named if aim.config is not None and aim.kind is None]
    found = table_store.config_keys(db, paths=sorted({path for _param, path in keys}))
    for param, path in keys:
        if path not in found and table_store.any_run(db):
            raise FieldInvalid(param, f"{param}: no run's config has {'.'.join(path)!r}")


def _at(config: dict[str, Any] | None, path: tuple[str, ...]) -> object:
    """The value at `path` in a config document; None where it has none."""
    value: object = config
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _scalar(value: object) -> Value:
    if value is None or isinstance(value, (float, str, bool)):
        return value
    if isinstance(value, (dict, list)):  # a script's nested config: as JSON, not Python's repr
        return json.dumps(value)
    return value if isinstance(value, int) else str(getattr(value, "value", value))


def checked_tags(tags: Sequence[str]) -> list[str]:
    """The tags, each checked (letters, digits and _ . : + / -, at most 64), without repeats; FieldInvalid else."""
    clean = list(dict.fromkeys(tag.strip() for tag in tags if tag.strip()))
    for tag in clean:
        if not TAG.match(tag):
            raise FieldInvalid("tags", f"tags: {tag[:80]!r} is not a tag (letters, digits, _ . : + / -, 1-64 long)")
    if len(clean) > MAX_TAGS:
        raise FieldInvalid("tags", f"tags: at most {MAX_TAGS} on a run")
    return clean


def label_run(
    db: Session, *, run_id: int, tags: Sequence[str] | None, notes: str | None, archived: bool | None, actor: str
) -> Run:
    """Replaces the run's tags, notes or archived mark (None: leaves it as it is)."""
    if notes is not None and len(notes) > MAX_NOTES:
        raise FieldInvalid("notes", f"notes: at most {MAX_NOTES} characters")
    clean = None if tags is None else checked_tags(tags)
    with db.begin():
        run = runs.get_run(db, run_id=run_id)
        if clean is not None:
            db.execute(delete(RunTag).where(RunTag.run_id == run.id))
            db.add_all(RunTag(run_id=run.id, tag=tag) for tag in clean)
        if notes is not None:
            run.notes = notes
        if archived is not None and archived != (run.archived_at is not None):
            run.archived_at = utcnow() if archived else None
            audit.record(db, actor=actor, action="archived" if archived else "unarchived", run_id=run.id)
    db.refresh(run)
    return run


def bulk(db: Session, *, run_ids: Sequence[int], action: BulkAction, tag: str | None, actor: str) -> list[int]:
    """Tags, untags, archives or unarchives every one of the runs, in one transaction; returns their ids."""
    ids = list(dict.fromkeys(run_ids))
    if not ids or len(ids) > MAX_BULK:
        raise FieldInvalid("runs", f"runs: give 1 to {MAX_BULK} run ids")
    if action in ("tag", "untag") and not tag:
        raise FieldInvalid("tag", f"tag: needed to {action}")
    tags = checked_tags([tag]) if tag else []
    with db.begin():
        for run in (runs.get_run(db, run_id=run_id) for run_id in ids):
            if action == "tag" and tags[0] not in run.tags:
                db.add(RunTag(run_id=run.id, tag=tags[0]))
            elif action == "untag":
                db.execute(delete(RunTag).where(RunTag.run_id == run.id, RunTag.tag == tags[0]))
            elif action in ("archive", "unarchive") and (action == "archive") != (run.archived_at is not None):
                run.archived_at = utcnow() if action == "archive" else None
                audit.record(db, actor=actor, action=f"{action}d", run_id=run.id)
    return ids
