"""The runs table's query: conditions, search, sort and page in one SELECT, every value a bound parameter.

A metric named by a condition or the sort joins its summary row (app.store.summaries) by (key, run): an index
lookup per run, so filtering and sorting 10,000 runs by a metric reads 10,000 small rows, never their points.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, exists, func, or_, select
from sqlalchemy.orm import Session, aliased, selectinload

from app.core.models import MetricSummary, Run, RunTag
from app.services.runs_table_query import Condition, RunQuery, Target

OPS = {"<": "__lt__", "<=": "__le__", ">": "__gt__", ">=": "__ge__", "=": "__eq__", "!=": "__ne__"}
SEARCHED = (Run.name, Run.status, Run.workload, Run.script, Run.launcher, Run.created_by)


class _Joins:
    """The summary rows a query joins, one alias per metric, each joined once however often it is named."""

    def __init__(self) -> None:
        self.aliases: dict[str, Any] = {}

    def column(self, aim: Target) -> Any:
        if aim.field is not None:
            return getattr(Run, aim.field)
        assert aim.metric is not None
        summary = self.aliases.setdefault(aim.metric, aliased(MetricSummary))
        return getattr(summary, f"{aim.stat}_value")

    def join(self, query: Any) -> Any:
        for metric, summary in self.aliases.items():
            query = query.outerjoin(summary, and_(summary.key == metric, summary.run_id == Run.id))
        return query


def _condition(joins: _Joins, condition: Condition) -> ColumnElement[bool]:
    column = joins.column(condition.target)
    return getattr(column, OPS[condition.op])(condition.value)


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
    joins = _Joins()
    where = [Run.deleting_at.is_(None), *(_condition(joins, c) for c in query.conditions)]
    where += _search(query.search.split())
    if query.status is not None:
        where.append(Run.status == query.status)
    if query.archived == "hide":
        where.append(Run.archived_at.is_(None))
    elif query.archived == "only":
        where.append(Run.archived_at.is_not(None))
    sort = joins.column(query.sort)
    order = sort.desc() if query.descending else sort.asc()
    selected = joins.join(select(Run.id)).where(*where)
    total = db.scalar(select(func.count()).select_from(selected.subquery())) or 0
    # Runs without the value (a metric they never logged) last either way; then newest first.
    ids = list(db.scalars(selected.order_by(sort.is_(None), order, Run.id.desc()).limit(limit).offset(offset)))
    if not ids:
        return [], total
    found = {run.id: run for run in db.scalars(select(Run).where(Run.id.in_(ids)).options(selectinload(Run.tag_rows)))}
    return [found[run_id] for run_id in ids], total


def reported_keys(db: Session, *, keys: Sequence[str]) -> set[str]:
    """Which of these metric keys some run has reported (an index lookup each: summaries are keyed (key, run))."""
    if not keys:
        return set()
    return set(db.scalars(select(MetricSummary.key).where(MetricSummary.key.in_(keys)).distinct()))


def any_reported(db: Session) -> bool:
    """Whether any run has reported any metric."""
    return db.scalar(select(MetricSummary.key).limit(1)) is not None


def summaries(db: Session, *, run_ids: Sequence[int], keys: Sequence[str]) -> dict[tuple[int, str], MetricSummary]:
    """The summaries of these runs' series of these keys, by (run, key)."""
    if not run_ids or not keys:
        return {}
    rows = db.scalars(select(MetricSummary).where(MetricSummary.run_id.in_(run_ids), MetricSummary.key.in_(keys)))
    return {(row.run_id, row.key): row for row in rows}
