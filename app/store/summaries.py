"""Each series' summary for the runs table: its last value, min and max, kept up to date on ingest.

Recomputed rather than merged, like the chart tiers, so a re-sent batch changes nothing: the min, max and highest step
come from the coarsest tier (app.store.charts), whose buckets together hold every point of the series, so the
read is a few rows per series however long it is; the last value, the lowest rank's at the highest step, is in the
tier row that holds that step.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.store.charts import TIERS

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
    """Recomputes the summary of each series from what is stored now; call it after refreshing the tiers."""
    params = [{"series_id": series_id, "tier": TIERS[-1]} for series_id in sorted(set(series_ids))]
    if params:
        db.execute(_REFRESH, params)
