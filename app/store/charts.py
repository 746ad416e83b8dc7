"""Charts: a series cut into at most `width` buckets, each bucket's min, max and last value exact.

Reading every point of a million-point series per request would freeze the page, and thinning by stride or average
loses the spike that matters. So wide buckets are aggregated from pre-aggregated rows: `metric_tiers` keeps each
rank's min, max, highest step and the value and unix time there per `tier` steps, for each tier in TIERS, refreshed
on ingest from the points themselves (so re-sending a batch changes nothing).

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

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from app.store import chunks

TIER_RATIO = 16
# Bucket sizes in steps; each tier is built from the one before it, TIER_RATIO of its rows per bucket.
TIERS = tuple(TIER_RATIO**level for level in range(1, 5))  # 16, 256, 4,096, 65,536
# (series_id, rank, first, last): an inclusive range of steps (for the finest tier) or of a tier's buckets.
Span = tuple[int, int, int, int]
# SQLite allows 32,766 parameters in one statement: 4 per span.
SPANS_PER_STATEMENT = 8000

# Each coarser tier from the tier before it, the value and time at each bucket's last step from the finer bucket
# holding that step (one join: a lookup per bucket, not one per column). The tier sizes are our constants, written
# into the text so that the GROUP BY expression is the same as the selected one on PostgreSQL too. (The finest tier
# comes from the chunks, in Python: `_finest_rows`.)
_FROM_TIER = (
    "SELECT g.series_id, {tier}, g.bucket, g.rank, g.min_value, g.max_value, g.last_step, l.last_value{time}"
    " FROM (SELECT f.series_id AS series_id, f.bucket / {ratio} AS bucket, f.rank AS rank,"
    "  MIN(f.min_value) AS min_value, MAX(f.max_value) AS max_value, MAX(f.last_step) AS last_step"
    "  FROM touched t, metric_tiers f"
    "  WHERE f.series_id = t.series_id AND f.tier = {finer} AND f.bucket BETWEEN t.first AND t.last"
    "  AND f.rank = t.rank"
    "  GROUP BY f.series_id, f.bucket / {ratio}, f.rank) g"
    " JOIN metric_tiers l ON l.series_id = g.series_id AND l.tier = {finer} AND l.bucket = g.last_step / {finer}"
    "  AND l.rank = g.rank"
    " WHERE true"  # SQLite: without a WHERE, the upsert's ON would read as the join's
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
    """One rank's bucket: its highest step, the min and max (NaN when it holds only NaN), and the value and unix time
    at its highest step.

    A named tuple, like StoredPoint: a chart is a thousand of them, and a frozen dataclass is several times slower to
    make.
    """

    rank: int
    step: int
    min: float
    max: float
    last: float
    time: float


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


def buckets(db: Session, *, series_id: int, chart: ChartPlan, rank: int | None) -> list[Bucket]:
    """The chart's buckets of every rank (or of `rank`), by rank then step.

    Whole tier buckets are aggregated in SQL, each chart bucket's last value and time read from the tier row holding
    its last step; the part-filled tier buckets at the ends (or a range too short for any tier) from the chunks' points.
    """
    found: dict[tuple[int, int], Bucket] = {}
    for first, last in _raw_ranges(chart):
        points = chunks.read(db, series_id=series_id, first=first, last=last, rank=rank)
        for k, bucket in _aggregated(points, chart):
            found[k] = _joined(found.get(k), bucket)
    if chart.tier is not None and (whole := _whole_tier_buckets(chart)) is not None:
        params: dict[str, Any] = {"series_id": series_id, "tier": chart.tier, "first_bucket": whole[0],
                                  "last_bucket": whole[1], "tier_origin": chart.origin // chart.tier,
                                  "tier_buckets": chart.bucket_steps // chart.tier, "rank": rank}  # fmt: skip
        rows: Sequence[Any] = db.execute(text(_tier_query(rank)), params).all()  # all at once: several times faster
        for rank_, k, low, high, step, last, when in rows:
            found[(rank_, k)] = _joined(
                found.get((rank_, k)), Bucket(rank_, step, _value(low), _value(high), _value(last), when)
            )
    return sorted(found.values(), key=lambda bucket: (bucket.rank, bucket.step))


def _aggregated(points: chunks.Points, chart: ChartPlan) -> list[tuple[tuple[int, int], Bucket]]:
    """Points as ((rank, k), bucket) of chart bucket k: min and max ignoring NaN, value and time at the last step."""
    if not len(points):
        return []
    k = (points.steps - chart.origin) // chart.bucket_steps
    order = np.lexsort((points.steps, k, points.ranks))
    ranks, k, steps, values = points.ranks[order], k[order], points.steps[order], points.values[order]
    starts = np.flatnonzero(np.r_[True, (np.diff(ranks) != 0) | (np.diff(k) != 0)])
    ends = np.r_[starts[1:], len(steps)] - 1
    first_ranks = ranks[starts].tolist()
    columns = zip(first_ranks, steps[ends].tolist(), np.fmin.reduceat(values, starts).tolist(),
                  np.fmax.reduceat(values, starts).tolist(), values[ends].tolist(),
                  points.times[order][ends].tolist(), strict=True)  # fmt: skip
    keys = zip(first_ranks, k[starts].tolist(), strict=True)
    return list(zip(keys, itertools.starmap(Bucket, columns), strict=True))  # no Python-level loop: a chart's hot path


def _joined(one: Bucket | None, other: Bucket) -> Bucket:
    """Two parts of one chart bucket as one: NaN in min or max means "no number there", as in the tiers."""
    if one is None:
        return other
    low = one.min if math.isnan(other.min) else other.min if math.isnan(one.min) else min(one.min, other.min)
    high = one.max if math.isnan(other.max) else other.max if math.isnan(one.max) else max(one.max, other.max)
    last = one if one.step > other.step else other
    return Bucket(one.rank, last.step, low, high, last.last, last.time)


def _value(stored: float | None) -> float:
    return math.nan if stored is None else stored  # NULL stands for NaN (see MetricPoint)


def _whole_tier_buckets(chart: ChartPlan) -> tuple[int, int] | None:
    """The first and last tier bucket lying wholly inside the range; None when there is none."""
    assert chart.tier is not None
    first, last = -(-chart.start_step // chart.tier), (chart.end_step + 1) // chart.tier - 1
    return (first, last) if first <= last else None


def _raw_ranges(chart: ChartPlan) -> list[tuple[int, int]]:
    """The step ranges read from raw points: all of it without a tier, else the part-filled tier buckets at the ends."""
    whole = None if chart.tier is None else _whole_tier_buckets(chart)
    if chart.tier is None or whole is None:
        return [(chart.start_step, chart.end_step)]
    head_end, tail_start = whole[0] * chart.tier - 1, (whole[1] + 1) * chart.tier
    ranges = []
    if chart.start_step <= head_end:
        ranges.append((chart.start_step, head_end))
    if tail_start <= chart.end_step:
        ranges.append((tail_start, chart.end_step))
    return ranges


def _tier_query(rank: int | None) -> str:
    only_rank = " AND rank = :rank" if rank is not None else ""
    return (
        "SELECT a.rank, a.k, a.min_value, a.max_value, a.last_step, t.last_value, t.last_time"
        " FROM (SELECT rank, (bucket - :tier_origin) / :tier_buckets AS k, MIN(min_value) AS min_value,"
        "  MAX(max_value) AS max_value, MAX(last_step) AS last_step FROM metric_tiers"
        f"  WHERE series_id = :series_id AND tier = :tier AND bucket BETWEEN :first_bucket AND :last_bucket{only_rank}"
        "  GROUP BY rank, k) a"
        " JOIN metric_tiers t ON t.series_id = :series_id AND t.tier = :tier AND t.bucket = a.last_step / :tier"
        "  AND t.rank = a.rank"
    )


def refresh_tiers(db: Session, written: Sequence[chunks.Written], *, times: bool = True) -> None:
    """Recomputes every tier bucket that the chunks' added points fall in, from what they hold now.

    Call it after writing the chunks, in the same transaction. It recomputes rather than merges, so a re-sent or
    overlapping batch gives the same rows as sending it once. The finest tier comes from the chunks in hand (a tier
    bucket lies in one chunk: chunks.SPAN); each coarser one from one INSERT ... SELECT ... ON CONFLICT DO UPDATE
    (more only past SQLite's parameter limit) over the ranges of buckets the batch touched. `times=False` leaves out
    `last_time`, for the tiers of a store before 0018 added it (migration 0015 builds them).
    """
    if not written:
        return
    rows = _finest_rows(written)
    if not times:
        rows = [row[:-1] for row in rows]
    columns, on_conflict = _upsert_parts(times=times)
    connection = db.connection()
    marker = chunks.marker(connection)
    connection.exec_driver_sql(
        f"INSERT INTO metric_tiers ({columns}) VALUES ({', '.join([marker] * len(rows[0]))}){on_conflict}", rows
    )
    spans = _merged((series_id, rank, bucket, bucket) for series_id, _tier, bucket, rank, *_values in rows)
    for finer, tier in itertools.pairwise(TIERS):
        ratio = tier // finer
        spans = _merged((series_id, rank, first // ratio, last // ratio) for series_id, rank, first, last in spans)
        # Each touched bucket is rebuilt from all of the finer tier's buckets inside it, not only the touched ones.
        in_finer = [
            (series_id, rank, first * ratio, last * ratio + ratio - 1) for series_id, rank, first, last in spans
        ]
        select = _FROM_TIER.format(tier=tier, ratio=ratio, finer=finer, time=", l.last_time" if times else "")
        _upsert(db, f"INSERT INTO metric_tiers ({columns}) {select}{on_conflict}", in_finer)


def _upsert_parts(*, times: bool) -> tuple[str, str]:
    """The column list of a tier row, and the ON CONFLICT clause that overwrites all but its key."""
    values = ["min_value", "max_value", "last_step", "last_value", *(["last_time"] if times else [])]
    updates = ", ".join(f"{name} = excluded.{name}" for name in values)
    columns = ", ".join(["series_id", "tier", "bucket", "rank", *values])
    return columns, f" ON CONFLICT (series_id, tier, bucket, rank) DO UPDATE SET {updates}"


def _finest_rows(written: Sequence[chunks.Written]) -> list[tuple[Any, ...]]:
    """The finest tier's rows of the buckets that gained points, with NULL for NaN: all chunks in one pass."""
    finest = TIERS[0]
    steps = np.concatenate([chunk.merged.steps for chunk in written])
    values = np.concatenate([chunk.merged.values for chunk in written])
    times = np.concatenate([chunk.merged.times for chunk in written])
    owner = np.repeat(np.arange(len(written)), [len(chunk.merged.steps) for chunk in written])
    bucket = steps // finest
    starts = np.flatnonzero(np.r_[True, (np.diff(bucket) != 0) | (np.diff(owner) != 0)])
    ends = np.r_[starts[1:], len(steps)] - 1
    lows, highs = np.fmin.reduceat(values, starts), np.fmax.reduceat(values, starts)
    touched = np.logical_or.reduceat(np.concatenate([chunk.added for chunk in written]), starts)
    starts, ends, lows, highs = starts[touched], ends[touched], lows[touched], highs[touched]
    series = np.array([chunk.series_id for chunk in written])[owner[starts]].tolist()
    ranks = np.array([chunk.rank for chunk in written])[owner[starts]].tolist()
    rows = zip(series, bucket[starts].tolist(), ranks, _nulls(lows), _nulls(highs), steps[ends].tolist(),
               _nulls(values[ends]), times[ends].tolist(), strict=True)  # fmt: skip
    return [(s, finest, b, rank, low, high, step, last, when) for s, b, rank, low, high, step, last, when in rows]


def _nulls(values: np.ndarray) -> list[float | None]:
    """NaN as None: SQLite would turn NaN into NULL, but PostgreSQL keeps it, and sorts it above every number."""
    return [None if value != value else value for value in values.tolist()]


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
    marker = chunks.marker(connection)
    for start in range(0, len(spans), SPANS_PER_STATEMENT):
        chunk = spans[start : start + SPANS_PER_STATEMENT]
        values = ",".join([f"({marker},{marker},{marker},{marker})"] * len(chunk))
        connection.exec_driver_sql(
            f"WITH touched (series_id, rank, first, last) AS (VALUES {values}) {statement}",
            tuple(value for span in chunk for value in span),
        )
