"""The runs table's query: conditions, search, sort and page in one SELECT, every value a bound parameter.

A metric named by a condition or the sort joins its summary row (app.store.summaries) by (key, run): an index
lookup per run, so filtering and sorting 10,000 runs by a metric reads 10,000 small rows, never their points. A key of
the config document is read from each run's JSON in SQL (SQLite's json_type and json_extract, PostgreSQL's jsonb #>),
by the kind of its value: a condition on a number never matches a run whose value is a text, and a run without the
key is last in any sort. No index serves it, as none served the option columns before: one pass over the runs, a
parse of each one's document on SQLite (bench/runs_table.py: ~20 ms more than a column at 10,000 runs; 12 ms on
PostgreSQL, whose jsonb is read without parsing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, case, exists, func, or_, select
from sqlalchemy.orm import Session, aliased, selectinload

from app.core.models import MetricSeries, MetricSummary, MetricTier, Run, RunTag
from app.store.charts import TIERS
from app.store.runs_table_query import Condition, RunQuery, Target

OPS = {"<": "__lt__", "<=": "__le__", ">": "__gt__", ">=": "__ge__", "=": "__eq__", "!=": "__ne__"}
SEARCHED = (Run.name, Run.status, Run.workload, Run.script, Run.launcher, Run.created_by)


def _sqlite_path(path: tuple[str, ...]) -> str:
    return "$" + "".join(f'."{key}"' for key in path)  # the keys hold no quote (runs_table_query._KEY)


class _Joins:
    """The summary rows a query joins, one alias per metric, each joined once however often it is named; and the
    config document's values in the database's own JSON functions."""

    def __init__(self, dialect: str) -> None:
        self.aliases: dict[str, Any] = {}
        self.dialect = dialect

    def values(self, aim: Target) -> list[Any]:
        """What a target sorts by: one value; for a key each run's script named, its number, flag and text."""
        if aim.config is not None:
            return [self.config(aim.config, kind) for kind in ([aim.kind] if aim.kind else [float, bool, str])]
        if aim.field is not None:
            return [getattr(Run, aim.field)]
        assert aim.metric is not None
        summary = self.aliases.setdefault(aim.metric, aliased(MetricSummary))
        return [getattr(summary, f"{aim.stat}_value")]

    def kind_of(self, path: tuple[str, ...]) -> Any:
        """The JSON type of the value at `path` in each run's config document; NULL where it has none."""
        if self.dialect == "sqlite":
            return func.json_type(Run.config, _sqlite_path(path))
        return func.jsonb_typeof(Run.config[path])

    def config(self, path: tuple[str, ...], kind: type) -> Any:
        """The value at `path` in each run's config document where it is of this kind (a flag as 1 or 0), else NULL."""
        found = self.kind_of(path)
        if self.dialect == "sqlite":
            value = func.json_extract(Run.config, _sqlite_path(path))
            if kind is bool:
                return case((found == "true", 1), (found == "false", 0))
            return case((found.in_(("integer", "real") if kind is float else ("text",)), value))
        node = Run.config[path]
        if kind is bool:
            return case((found == "boolean", case((node.as_string() == "true", 1), else_=0)))
        if kind is float:
            return case((found == "number", node.as_float()))
        return case((found == "string", node.as_string()))

    def join(self, query: Any) -> Any:
        for metric, summary in self.aliases.items():
            query = query.outerjoin(summary, and_(summary.key == metric, summary.run_id == Run.id))
        return query


def _condition(joins: _Joins, condition: Condition) -> ColumnElement[bool]:
    aim, value = condition.target, condition.value
    if aim.config is not None:
        kind = bool if isinstance(value, bool) else float if isinstance(value, float) else str
        column, value = joins.config(aim.config, kind), int(value) if isinstance(value, bool) else value
    else:
        (column,) = joins.values(aim)
    return getattr(column, OPS[condition.op])(value)


def _escaped(word: str) -> str:
    return "%" + word.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _search(words: Sequence[str]) -> list[ColumnElement[bool]]:
    """Each word somewhere in a run's name, status, workload, script, launcher, creator or tags (any case)."""
    found = []
    for word in words:
        pattern = _escaped(word)
        in_columns = [func.lower(column).like(pattern, escape="\\") for column in SEARCHED]
        tagged = exists().where(RunTag.run_id == Run.id, func.lower(RunTag.tag).like(pattern, escape="\\"))
        found.append(or_(*in_columns, tagged))
    return found


def page(db: Session, query: RunQuery, *, limit: int, offset: int) -> tuple[Sequence[Run], int]:
    """The runs on one page of the view, and how many match in all."""
    joins = _Joins(db.get_bind().dialect.name)
    where = [Run.deleting_at.is_(None), *(_condition(joins, c) for c in query.conditions)]
    where += _search(query.search.split())
    if query.status is not None:
        where.append(Run.status == query.status)
    if query.archived == "hide":
        where.append(Run.archived_at.is_(None))
    elif query.archived == "only":
        where.append(Run.archived_at.is_not(None))
    keys = joins.values(query.sort)
    order = [(key.desc() if query.descending else key.asc()).nulls_last() for key in keys]
    selected = joins.join(select(Run.id)).where(*where)
    total = db.scalar(select(func.count()).select_from(selected.subquery())) or 0
    # Runs without the value (a metric they never logged, a key their config lacks) last either way (NULLS LAST on
    # each of a script's key's number, flag and text: its numbers first, then its flags, then its texts); then newest.
    ids = list(db.scalars(selected.order_by(*order, Run.id.desc()).limit(limit).offset(offset)))
    if not ids:
        return [], total
    found = {run.id: run for run in db.scalars(select(Run).where(Run.id.in_(ids)).options(selectinload(Run.tag_rows)))}
    return [found[run_id] for run_id in ids], total


def reported_keys(db: Session, *, keys: Sequence[str]) -> set[str]:
    """Which of these metric keys some run has reported (an index lookup each: summaries are keyed (key, run))."""
    if not keys:
        return set()
    return set(db.scalars(select(MetricSummary.key).where(MetricSummary.key.in_(keys)).distinct()))


def config_keys(db: Session, *, paths: Sequence[tuple[str, ...]]) -> set[tuple[str, ...]]:
    """Which of these keys some run's config document has (each a scan that stops at the first run that has it)."""
    joins = _Joins(db.get_bind().dialect.name)
    found = [(path, select(Run.id).where(joins.kind_of(path).is_not(None)).limit(1)) for path in paths]
    return {path for path, first in found if db.scalar(first) is not None}


def any_run(db: Session) -> bool:
    """Whether the store holds any run."""
    return db.scalar(select(Run.id).limit(1)) is not None


def any_reported(db: Session) -> bool:
    """Whether any run has reported any metric."""
    return db.scalar(select(MetricSummary.key).limit(1)) is not None


def summaries(db: Session, *, run_ids: Sequence[int], keys: Sequence[str]) -> dict[tuple[int, str], MetricSummary]:
    """The summaries of these runs' series of these keys, by (run, key)."""
    if not run_ids or not keys:
        return {}
    rows = db.scalars(select(MetricSummary).where(MetricSummary.run_id.in_(run_ids), MetricSummary.key.in_(keys)))
    return {(row.run_id, row.key): row for row in rows}


def sparklines(
    db: Session, *, run_ids: Sequence[int], keys: Sequence[str], points: int
) -> dict[tuple[int, str], list[tuple[int, float]]]:
    """A small line of each of these runs' series of these keys, by (run, key): per bucket of the finest tier that
    cuts the series into fewer than `points` buckets, its highest step and the ranks' mean of their last values
    there (NaN buckets left out), and the summary's last value at the end. One query for the whole page, a few rows
    per series however long it is."""
    if not run_ids or not keys:
        return {}
    # The tier each series is read at, from its summary's highest step (the coarsest where none is fine enough).
    tier = case(*((MetricSummary.last_step < points * size, size) for size in TIERS[:-1]), else_=TIERS[-1])
    # A coarser tier's bucket is built once the series' steps pass it (app.store.charts.merge_tiers).
    closed = or_(tier == TIERS[0], (MetricTier.bucket + 1) * tier - 1 <= MetricSummary.last_step)
    rows = db.execute(
        select(
            MetricSeries.run_id,
            MetricSeries.key,
            func.max(MetricTier.last_step),
            func.avg(MetricTier.last_value),
            func.max(MetricSummary.last_step),
            func.max(MetricSummary.last_value),
        )
        .join(MetricSummary, MetricSummary.series_id == MetricSeries.id)
        .join(MetricTier, and_(MetricTier.series_id == MetricSeries.id, MetricTier.tier == tier))
        .where(MetricSeries.run_id.in_(run_ids), MetricSeries.key.in_(keys), MetricTier.last_value.is_not(None), closed)
        .group_by(MetricSeries.run_id, MetricSeries.key, MetricTier.bucket)
        .order_by(MetricSeries.run_id, MetricSeries.key, MetricTier.bucket)
    )
    lines: dict[tuple[int, str], list[tuple[int, float]]] = {}
    ends: dict[tuple[int, str], tuple[int, float | None]] = {}
    for run_id, key, step, value, last_step, last_value in rows:
        lines.setdefault((run_id, key), []).append((int(step), float(value)))
        ends[run_id, key] = (int(last_step), last_value)
    for series, (last_step, last_value) in ends.items():
        if last_value is not None and last_step > lines[series][-1][0]:  # in a bucket still open
            lines[series].append((last_step, float(last_value)))
    return lines
