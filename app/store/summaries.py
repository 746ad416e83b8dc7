"""Each series' summary for the runs table: its last value, min and max, kept up to date on ingest.

Ingest merges the points it added (`merge`): min and max as min and max, the highest step as the higher; the last
value, the lowest rank's at the highest step, is read from the finest tier's row that holds that step (merged just
before), one row, where recomputing read every rank's rows. Only new points are merged, so a re-sent batch changes
nothing. `refresh` recomputes from the coarsest tier (app.store.charts), whose buckets together hold every point of
the series once `refresh_tiers` has built them all, for a store being built (migrations): ingest leaves a coarse
bucket open until the series' steps pass it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.store import chunks
from app.store.charts import TIERS, nulls
from app.store.chunks import Written

_REFRESH = text(
    "INSERT INTO metric_summaries (series_id, run_id, key, last_step, last_value, min_value, max_value)"
    " SELECT s.id, s.run_id, s.key, a.last_step,"
    "  (SELECT l.last_value FROM metric_tiers l WHERE l.series_id = s.id AND l.tier = :tier"
    "   AND l.bucket = a.last_step / :tier AND l.last_step = a.last_step ORDER BY l.rank LIMIT 1),"
    "  a.min_value, a.max_value"
    " FROM metric_series s JOIN (SELECT t.series_id AS series_id, MAX(t.last_step) AS last_step,"
    "  MIN(t.min_value) AS min_value, MAX(t.max_value) AS max_value FROM metric_tiers t"
    "  WHERE t.series_id = :series_id AND t.tier = :tier GROUP BY t.series_id) a ON a.series_id = s.id"
    " WHERE true"  # SQLite: without a WHERE, the upsert's ON would read as the join's
    " ON CONFLICT (series_id) DO UPDATE SET last_step = excluded.last_step, last_value = excluded.last_value,"
    " min_value = excluded.min_value, max_value = excluded.max_value"
)


def refresh(db: Session, series_ids: Iterable[int]) -> None:
    """Recomputes the summary of each series from what is stored now; call it after rebuilding the series' tiers
    (app.store.charts.refresh_tiers)."""
    params = [{"series_id": series_id, "tier": TIERS[-1]} for series_id in sorted(set(series_ids))]
    if params:
        db.execute(_REFRESH, params)


# The last value: the lowest rank's at the highest step, read from the finest tier's row holding that step (merged
# just before; a coarser one is merged only once closed); taken when the added points reach the summary's highest
# step, else the summary's own stays. Each added row is (series_id, the highest step added, the finest bucket of that
# step, min, max): on SQLite a statement per row, its values in place (through a subquery of them, SQLite took a
# quarter longer); on PostgreSQL one for all, from arrays (app.store.chunks.insert_many). Both through the driver:
# SQLAlchemy's own handling of each row's named parameters cost more than the statement (bench/big_job.py).
_INSERT = "INSERT INTO metric_summaries (series_id, run_id, key, last_step, last_value, min_value, max_value)"
_LAST_VALUE = (
    f"(SELECT l.last_value FROM metric_tiers l WHERE l.series_id = {{series_id}} AND l.tier = {TIERS[0]}"
    " AND l.bucket = {bucket} AND l.last_step = {top} ORDER BY l.rank LIMIT 1)"
)
_ON_CONFLICT = (
    " ON CONFLICT (series_id) DO UPDATE SET"
    " min_value = CASE WHEN metric_summaries.min_value IS NULL OR excluded.min_value < metric_summaries.min_value"
    "  THEN excluded.min_value ELSE metric_summaries.min_value END,"
    " max_value = CASE WHEN metric_summaries.max_value IS NULL OR excluded.max_value > metric_summaries.max_value"
    "  THEN excluded.max_value ELSE metric_summaries.max_value END,"
    " last_value = CASE WHEN excluded.last_step >= metric_summaries.last_step THEN excluded.last_value"
    "  ELSE metric_summaries.last_value END,"
    " last_step = CASE WHEN excluded.last_step > metric_summaries.last_step THEN excluded.last_step"
    "  ELSE metric_summaries.last_step END"
)
_MERGE_ONE = (
    f"{_INSERT} SELECT s.id, s.run_id, s.key, ?, {_LAST_VALUE.format(series_id='?', bucket='?', top='?')}, ?, ?"
    f" FROM metric_series s WHERE s.id = ?{_ON_CONFLICT}"
)
_TYPES = ("integer", "bigint", "bigint", "float8", "float8")
_MERGE_ALL = (
    f"{_INSERT} SELECT s.id, s.run_id, s.key, a.top,"
    f" {_LAST_VALUE.format(series_id='a.series_id', bucket='a.bucket', top='a.top')}, a.low, a.high"
    f" FROM {chunks.arrays(_TYPES)}"
    f" AS a(series_id, top, bucket, low, high) JOIN metric_series s ON s.id = a.series_id{_ON_CONFLICT}"
)


def merge(db: Session, written: Sequence[Written]) -> None:
    """Merges the chunks' added points into their series' summaries (ingest's way: no read of every rank's rows);
    call it after merging them into the tiers (app.store.charts.merge_tiers), in the same transaction."""
    import numpy as np

    written = sorted((chunk for chunk in written if len(chunk.new.steps)), key=lambda chunk: chunk.series_id)
    if not written:
        return
    # All series at once, as the tiers' rows are made: a GPU node's post adds a point or two to each of ~90 series.
    series = np.array([chunk.series_id for chunk in written])
    starts = np.flatnonzero(np.r_[True, series[1:] != series[:-1]])
    sizes = [len(chunk.new.steps) for chunk in written]
    values = np.concatenate([chunk.new.values for chunk in written])
    firsts = np.r_[0, np.cumsum(sizes)[:-1]][starts]  # each series' first point among `values`
    lows, highs = np.fmin.reduceat(values, firsts), np.fmax.reduceat(values, firsts)
    tops = np.maximum.reduceat(np.array([int(chunk.new.steps[-1]) for chunk in written]), starts).tolist()
    added = zip(series[starts].tolist(), tops, nulls(lows), nulls(highs), strict=True)
    connection = db.connection()
    if connection.dialect.name == "postgresql":
        rows = [(s, top, top // TIERS[0], low, high) for s, top, low, high in added]
        connection.exec_driver_sql(_MERGE_ALL, chunks.columns_of(rows, _TYPES))
    else:
        each = [(top, s, top // TIERS[0], top, low, high, s) for s, top, low, high in added]
        connection.exec_driver_sql(_MERGE_ONE, each)
