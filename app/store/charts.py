"""Charts: a series cut into at most `width` buckets, each bucket's min, max and last value computed by the database.

Reading every point of a million-point series per request would freeze the page, and thinning by stride or average
loses the spike that matters. So the database aggregates, and for wide buckets it aggregates pre-aggregated rows:
`metric_tiers` keeps each rank's min, max and highest step per `tier` steps, for each tier in TIERS, refreshed on
ingest from the points themselves (so re-sending a batch changes nothing).

A chart reads the coarsest tier whose bucket fits in the requested bucket, so at most TIER_RATIO * width rows per
rank, or the raw points when the requested bucket is smaller than the finest tier (fewer than TIERS[0] * width
steps). Results stay exact: requested buckets are whole tier buckets (see `plan`), and the steps at the edges of the
range that only part-fill a tier bucket are read from the raw points.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from app.store.metrics import POINTS, SERIES, PointRow

TIER_RATIO = 16
# Bucket sizes in steps; each tier is built from the one before it, TIER_RATIO of its rows per bucket.
TIERS = tuple(TIER_RATIO**level for level in range(1, 5))  # 16, 256, 4,096, 65,536
# (series_id, rank, first, last): an inclusive range of steps (for the finest tier) or of a tier's buckets.
Span = tuple[int, int, int, int]
# SQLite allows 32,766 parameters in one statement: 4 per span.
SPANS_PER_STATEMENT = 8000

_UPSERT = (
    "INSERT INTO metric_tiers (series_id, tier, bucket, rank, min_value, max_value, last_step) {select}"
    " ON CONFLICT (series_id, tier, bucket, rank) DO UPDATE SET min_value = excluded.min_value,"
    " max_value = excluded.max_value, last_step = excluded.last_step"
)
# The finest tier from the points; each coarser one from the tier before it. The tier sizes are our constants,
# written into the text so that the GROUP BY expression is the same as the selected one on PostgreSQL too.
_FROM_POINTS = (
    "SELECT p.series_id, {tier}, p.step / {tier}, p.rank, MIN(p.value), MAX(p.value), MAX(p.step)"
    " FROM touched t, metric_points p"
    " WHERE p.series_id = t.series_id AND p.step BETWEEN t.first AND t.last AND p.rank = t.rank"
    " GROUP BY p.series_id, p.step / {tier}, p.rank"
)
_FROM_TIER = (
    "SELECT f.series_id, {tier}, f.bucket / {ratio}, f.rank, MIN(f.min_value), MAX(f.max_value), MAX(f.last_step)"
    " FROM touched t, metric_tiers f"
    " WHERE f.series_id = t.series_id AND f.tier = {finer} AND f.bucket BETWEEN t.first AND t.last"
    " AND f.rank = t.rank"
    " GROUP BY f.series_id, f.bucket / {ratio}, f.rank"
)


@dataclass(frozen=True)
class ChartPlan:
    """How a range is cut: bucket k holds steps origin + k * bucket_steps ... + bucket_steps - 1 (within the range).

    `tier` is the tier read for the whole tier buckets inside the range, or None to read only raw points.
    """

    start_step: int
    end_step: int
    origin: int
    bucket_steps: int
    tier: int | None


class Bucket(NamedTuple):
    """One rank's bucket: its highest step, and the min, max (NaN when it holds only NaN) and value there.

    A named tuple, like StoredPoint: a chart is a thousand of them, and a frozen dataclass is several times slower to
    make.
    """

    rank: int
    step: int
    min: float
    max: float
    last: float


def plan(*, start_step: int, end_step: int, width: int) -> ChartPlan:
    """Cuts [start_step, end_step] into at most `width` buckets, whole tier buckets where a tier can serve them.

    The requested bucket size, ceil(steps / width), is rounded up to a multiple of the coarsest tier that is not
    bigger than it, and buckets start at start_step rounded down to that tier's boundary; so each tier bucket falls
    in exactly one chart bucket and the tier's min and max are exact for it. A range with fewer steps than `width`
    gets one bucket per step.
    """
    steps = end_step - start_step + 1
    wanted = -(-steps // width)
    tier = max((t for t in TIERS if t <= wanted), default=None)
    if tier is None:
        return ChartPlan(start_step, end_step, start_step, wanted, None)
    origin = start_step // tier * tier
    # Whole tiers, and enough of them that (end_step - origin) // bucket_steps < width.
    bucket_steps = -(-(end_step - origin + 1) // width)
    bucket_steps = -(-bucket_steps // tier) * tier
    return ChartPlan(start_step, end_step, origin, bucket_steps, tier)


def find_series(db: Session, *, run_id: int, key: str) -> int | None:
    return db.scalar(select(SERIES.c.id).where(SERIES.c.run_id == run_id, SERIES.c.key == key))


def step_range(db: Session, *, series_id: int) -> tuple[int, int] | None:
    """The lowest and highest step of the series, any rank; None when it has no points."""
    # Two queries: SQLite answers a lone MIN or MAX with one index seek, but MIN and MAX together with a scan.
    in_series = POINTS.c.series_id == series_id
    first = db.scalar(select(func.min(POINTS.c.step)).where(in_series))
    last = db.scalar(select(func.max(POINTS.c.step)).where(in_series))
    return None if first is None or last is None else (first, last)


def buckets(db: Session, *, series_id: int, chart: ChartPlan, rank: int | None) -> list[Bucket]:
    """The chart's buckets of every rank (or of `rank`), by rank then step: one statement, aggregated in SQL."""
    params: dict[str, Any] = {"series_id": series_id, "origin": chart.origin, "bucket_steps": chart.bucket_steps}
    segments = []
    for name, first, last in _raw_ranges(chart):
        segments.append(_raw_segment(name, rank))
        params |= {f"{name}_first": first, f"{name}_last": last}
    if chart.tier is not None and (whole := _whole_tier_buckets(chart)) is not None:
        segments.append(_tier_segment(rank))
        params |= {"tier": chart.tier, "first_bucket": whole[0], "last_bucket": whole[1]}
        params |= {"tier_origin": chart.origin // chart.tier, "tier_buckets": chart.bucket_steps // chart.tier}
    if rank is not None:
        params["rank"] = rank
    # The value at each bucket's highest step is one lookup in the (series_id, step, rank) index.
    query = text(
        "SELECT a.rank, a.last_step, a.min_value, a.max_value,"
        " (SELECT p.value FROM metric_points p WHERE p.series_id = :series_id AND p.step = a.last_step"
        "  AND p.rank = a.rank) AS last_value"
        " FROM (SELECT s.rank AS rank, MIN(s.min_value) AS min_value, MAX(s.max_value) AS max_value,"
        "  MAX(s.last_step) AS last_step"
        f"  FROM ({' UNION ALL '.join(segments)}) s GROUP BY s.rank, s.k) a"
        " ORDER BY a.rank, a.last_step"
    )
    rows: Sequence[Any] = db.execute(query, params).all()  # all at once: row by row is several times slower
    return [Bucket(rank, step, _value(low), _value(high), _value(last)) for rank, step, low, high, last in rows]


def _value(stored: float | None) -> float:
    return math.nan if stored is None else stored  # NULL stands for NaN (see MetricPoint)


def _whole_tier_buckets(chart: ChartPlan) -> tuple[int, int] | None:
    """The first and last tier bucket lying wholly inside the range; None when there is none."""
    assert chart.tier is not None
    first, last = -(-chart.start_step // chart.tier), (chart.end_step + 1) // chart.tier - 1
    return (first, last) if first <= last else None


def _raw_ranges(chart: ChartPlan) -> list[tuple[str, int, int]]:
    """The step ranges read from raw points: all of it without a tier, else the part-filled tier buckets at the ends."""
    whole = None if chart.tier is None else _whole_tier_buckets(chart)
    if chart.tier is None or whole is None:
        return [("raw", chart.start_step, chart.end_step)]
    head_end, tail_start = whole[0] * chart.tier - 1, (whole[1] + 1) * chart.tier
    ranges = []
    if chart.start_step <= head_end:
        ranges.append(("head", chart.start_step, head_end))
    if tail_start <= chart.end_step:
        ranges.append(("tail", tail_start, chart.end_step))
    return ranges


def _raw_segment(name: str, rank: int | None) -> str:
    only_rank = " AND rank = :rank" if rank is not None else ""
    return (
        "SELECT rank, (step - :origin) / :bucket_steps AS k, MIN(value) AS min_value, MAX(value) AS max_value,"
        " MAX(step) AS last_step FROM metric_points"
        f" WHERE series_id = :series_id AND step BETWEEN :{name}_first AND :{name}_last{only_rank}"
        " GROUP BY rank, k"
    )


def _tier_segment(rank: int | None) -> str:
    only_rank = " AND rank = :rank" if rank is not None else ""
    return (
        "SELECT rank, (bucket - :tier_origin) / :tier_buckets AS k, MIN(min_value) AS min_value,"
        " MAX(max_value) AS max_value, MAX(last_step) AS last_step FROM metric_tiers"
        f" WHERE series_id = :series_id AND tier = :tier AND bucket BETWEEN :first_bucket AND :last_bucket{only_rank}"
        " GROUP BY rank, k"
    )


def refresh_tiers(db: Session, rows: Sequence[PointRow]) -> None:
    """Recomputes every tier bucket that the rows' steps fall in, from what is stored now.

    Call it after inserting the rows, in the same transaction. It recomputes rather than merges, so a re-sent or
    overlapping batch gives the same rows as sending it once. One INSERT ... SELECT ... ON CONFLICT DO UPDATE per
    tier (more only past SQLite's parameter limit), over the ranges of buckets the batch touched.
    """
    finest = TIERS[0]
    # Per (series, rank): ranges of the finest tier's buckets that the batch touched.
    touched = {(series_id, rank, step // finest) for series_id, step, rank, _v, _t in rows}
    spans = _merged((series_id, rank, bucket, bucket) for series_id, rank, bucket in touched)
    in_steps = [(series_id, rank, first * finest, last * finest + finest - 1) for series_id, rank, first, last in spans]
    _upsert(db, _UPSERT.format(select=_FROM_POINTS.format(tier=finest)), in_steps)
    for finer, tier in itertools.pairwise(TIERS):
        ratio = tier // finer
        spans = _merged((series_id, rank, first // ratio, last // ratio) for series_id, rank, first, last in spans)
        # Each touched bucket is rebuilt from all of the finer tier's buckets inside it, not only the touched ones.
        in_finer = [
            (series_id, rank, first * ratio, last * ratio + ratio - 1) for series_id, rank, first, last in spans
        ]
        _upsert(db, _UPSERT.format(select=_FROM_TIER.format(tier=tier, ratio=ratio, finer=finer)), in_finer)


def _merged(spans: Iterable[Span]) -> list[Span]:
    """The same ranges, overlapping and adjacent ones joined: fewer ranges, and no row read twice."""
    merged: list[Span] = []
    for series_id, rank, first, last in sorted(spans):
        if merged and merged[-1][:2] == (series_id, rank) and first <= merged[-1][3] + 1:
            merged[-1] = (series_id, rank, merged[-1][2], max(last, merged[-1][3]))
        else:
            merged.append((series_id, rank, first, last))
    return merged


def _upsert(db: Session, statement: str, spans: Sequence[Span]) -> None:
    connection = db.connection()
    marker = "?" if connection.dialect.paramstyle == "qmark" else "%s"
    for start in range(0, len(spans), SPANS_PER_STATEMENT):
        chunk = spans[start : start + SPANS_PER_STATEMENT]
        values = ",".join([f"({marker},{marker},{marker},{marker})"] * len(chunk))
        connection.exec_driver_sql(
            f"WITH touched (series_id, rank, first, last) AS (VALUES {values}) {statement}",
            tuple(value for span in chunk for value in span),
        )
