"""Metric series and their points."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Insert, Result, Table, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.models import MetricPoint, MetricSeries

# (series_id, step, rank, value, time); value None is NaN (see MetricPoint).
PointRow = tuple[int, int, int, float | None, float]
# SQLite allows 32,766 parameters in one statement: 5 per row.
ROWS_PER_INSERT = 6000

POINTS: Table = MetricPoint.__table__  # type: ignore[assignment]
SERIES: Table = MetricSeries.__table__  # type: ignore[assignment]


class StoredPoint(NamedTuple):
    """A point as read back: `id` orders points by arrival, for cursors.

    A named tuple, not a dataclass: live pages read thousands a second, and a tuple is made several times faster.
    """

    id: int
    key: str
    step: int
    rank: int
    value: float
    time: float


def _insert_ignoring_duplicates(db: Session, table: Table) -> Insert:
    dialect = postgresql if db.get_bind().dialect.name == "postgresql" else sqlite
    return dialect.insert(table).on_conflict_do_nothing()


def series_ids(db: Session, *, run_id: int, keys: Iterable[str]) -> dict[str, int]:
    """The series id of each key of the run, creating the series that do not exist yet."""
    wanted = set(keys)
    if not wanted:
        return {}
    db.execute(_insert_ignoring_duplicates(db, SERIES), [{"run_id": run_id, "key": key} for key in sorted(wanted)])
    rows = db.execute(select(SERIES.c.key, SERIES.c.id).where(SERIES.c.run_id == run_id, SERIES.c.key.in_(wanted)))
    return {key: series_id for key, series_id in rows}


def insert_points(db: Session, rows: Sequence[PointRow]) -> int:
    """Inserts (series_id, step, rank, value, time) rows, skipping those already stored; returns how many were new.

    One multi-row INSERT per chunk, sent through the driver: building SQLAlchemy parameters row by row costs more
    than the insert itself. Every chunk of a batch has the same text, so the driver's statement cache reuses it.
    """
    connection = db.connection()
    if connection.dialect.name == "postgresql":
        return _insert_arrays(db, rows)
    marker = "?" if connection.dialect.paramstyle == "qmark" else "%s"
    stored = 0
    for start in range(0, len(rows), ROWS_PER_INSERT):
        chunk = rows[start : start + ROWS_PER_INSERT]
        values = ",".join([f"({marker},{marker},{marker},{marker},{marker})"] * len(chunk))
        result = connection.exec_driver_sql(
            f"INSERT INTO metric_points (series_id, step, rank, value, time) VALUES {values} ON CONFLICT DO NOTHING",
            tuple(itertools.chain.from_iterable(chunk)),
        )
        stored += max(result.rowcount, 0)
    return stored


def _insert_arrays(db: Session, rows: Sequence[PointRow]) -> int:
    """PostgreSQL's way: five arrays, one per column, unnested into rows by the server. A multi-row VALUES of
    thousands of parameters made psycopg spend ~75 us per row (bench/ingest.py --postgres); this is one statement."""
    if not rows:
        return 0
    series, steps, ranks, values, times = (list(column) for column in zip(*rows, strict=True))
    result = db.connection().exec_driver_sql(
        "INSERT INTO metric_points (series_id, step, rank, value, time) SELECT * FROM unnest("
        "%s::integer[], %s::bigint[], %s::integer[], %s::double precision[], %s::double precision[])"
        " ON CONFLICT DO NOTHING",
        (series, steps, ranks, values, times),
    )
    return max(result.rowcount, 0)


def series_keys(db: Session, *, run_id: int) -> list[str]:
    return list(db.scalars(select(SERIES.c.key).where(SERIES.c.run_id == run_id).order_by(SERIES.c.key)))


def _point_columns() -> Any:
    return select(POINTS.c.id, SERIES.c.key, POINTS.c.step, POINTS.c.rank, POINTS.c.value, POINTS.c.time).join(
        SERIES, SERIES.c.id == POINTS.c.series_id
    )


def _stored(result: Result[Any]) -> list[StoredPoint]:
    # All rows at once: iterating a result fetches them one by one, several times slower. NULL stands for NaN (see
    # MetricPoint).
    rows: Sequence[Any] = result.all()
    return [
        StoredPoint(id_, key, step, rank, math.nan if value is None else value, time)
        for id_, key, step, rank, value, time in rows
    ]


def points_in_range(
    db: Session, *, run_id: int, key: str, start_step: int, start_rank: int, end_step: int | None, limit: int
) -> list[StoredPoint]:
    """Points of one series from (start_step, start_rank) on, up to end_step, by step then rank."""
    # The step bound alone keeps the read to a range of the (series, step, rank) index; the OR then drops the ranks
    # of start_step before start_rank.
    after = or_(POINTS.c.step > start_step, POINTS.c.rank >= start_rank)
    query = _point_columns().where(SERIES.c.run_id == run_id, SERIES.c.key == key, POINTS.c.step >= start_step, after)
    if end_step is not None:
        query = query.where(POINTS.c.step <= end_step)
    return _stored(db.execute(query.order_by(POINTS.c.step, POINTS.c.rank).limit(limit)))


def points_after(db: Session, *, run_id: int, after_id: int, limit: int) -> list[StoredPoint]:
    """Points of every series of the run stored after the point with id `after_id`, in the order they came."""
    query = _point_columns().where(SERIES.c.run_id == run_id, POINTS.c.id > after_id)
    return _stored(db.execute(query.order_by(POINTS.c.id).limit(limit)))


def last_value(db: Session, *, run_id: int, key: str) -> float | None:
    """The value at the highest step of a series (rank 0), or None when it has no points."""
    points = db.execute(
        _point_columns()
        .where(SERIES.c.run_id == run_id, SERIES.c.key == key, POINTS.c.rank == 0)
        .order_by(POINTS.c.step.desc())
        .limit(1)
    )
    stored = _stored(points)
    return stored[0].value if stored else None


def last_point_id(db: Session) -> int:
    """The newest point's id of any run, 0 without any: where a freshly loaded page's live stream starts.

    Any run's, not only the page's: ids are one sequence, so everything of this run up to it is already in what the
    page's charts read, and MAX over the primary key is one index lookup, where the run's own newest would scan
    every point of its series.
    """
    return db.scalar(select(func.max(POINTS.c.id))) or 0
