"""Charts: a series cut into at most `width` buckets, each bucket's min, max and last value exact.

Reading every point of a million-point series per request would freeze the page, and thinning by stride or average
loses the spike that matters. So wide buckets are aggregated from pre-aggregated rows: `metric_tiers` keeps each
rank's min, max, highest step and the value and unix time there per `tier` steps, for each tier in TIERS: ingest
merges the points it added into the finest tier (`merge_tiers`: a point already stored is never added again, so
re-sending a batch changes nothing), and into a coarser tier's bucket only once the bucket is closed (it lies wholly
at or below the series' highest step): a chart reads a coarse bucket only then, so an open one is built from the
finer tier when the series' steps pass its end. `refresh_tiers` rebuilds buckets from the points, for a store being
built.

A chart reads the coarsest tier whose bucket fits in the requested bucket, so at most TIER_RATIO * width rows per
rank, or the raw points when the requested bucket is smaller than the finest tier (fewer than TIERS[0] * width
steps). Results stay exact: requested buckets are whole tier buckets (see `plan`); at the edges of the range, what
only part-fills a tier bucket is read from finer tiers' whole buckets, and the few steps left from the raw points.

The read is the chart's hot path (bench/versus_tensorboard.py): the aggregation stays in SQL, the rows come through
the driver's own cursor, and the buckets are assembled as numpy columns (`Buckets`), not an object each. numpy is
imported by the functions that use it, as in app.store.chunks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from app.core import pg_arrays
from app.store import chunks

if TYPE_CHECKING:
    import numpy as np

TIER_RATIO = 16
# Bucket sizes in steps; each tier is built from the one before it, TIER_RATIO of its rows per bucket.
TIERS = tuple(TIER_RATIO**level for level in range(1, 5))  # 16, 256, 4,096, 65,536
# (series_id, rank, first, last): an inclusive range of steps (for the finest tier) or of a tier's buckets; or
# (series_id, first, last), of every rank.
Span = tuple[int, ...]
# SQLite allows 32,766 parameters in one statement: 4 per span at most.
SPANS_PER_STATEMENT = 8000
_PER_RANK = " AND f.rank = t.rank"

# Each coarser tier from the tier before it, the value and time at each bucket's last step from the finer bucket
# holding that step (one join: a lookup per bucket, not one per column). The tier sizes are our constants, written
# into the text so that the GROUP BY expression is the same as the selected one on PostgreSQL too. `touched` names
# (series, rank, first, last) finer buckets, or with {ranks} empty (series, first, last) of every rank. (The finest
# tier comes from the chunks, in Python: `_finest_rows`.)
_FROM_TIER = (
    "SELECT g.series_id, {tier}, g.bucket, g.rank, g.min_value, g.max_value, g.last_step, l.last_value{time}"
    " FROM (SELECT f.series_id AS series_id, f.bucket / {ratio} AS bucket, f.rank AS rank,"
    "  MIN(f.min_value) AS min_value, MAX(f.max_value) AS max_value, MAX(f.last_step) AS last_step"
    "  FROM touched t, metric_tiers f"
    "  WHERE f.series_id = t.series_id AND f.tier = {finer} AND f.bucket BETWEEN t.first AND t.last{ranks}"
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


@dataclass(frozen=True)
class Buckets:
    """A chart's buckets as equally long columns, by rank then step: each bucket's rank, its highest step, its min
    and max (NaN when it holds only NaN), and the value and unix time at its highest step.

    Columns, not an object per bucket: a chart is a thousand buckets, assembled, merged and written as JSON whole.
    """

    ranks: np.ndarray
    steps: np.ndarray
    mins: np.ndarray
    maxs: np.ndarray
    lasts: np.ndarray
    times: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)

    @staticmethod
    def of_points(points: chunks.Points) -> Buckets:
        """Each point as a bucket of its own."""
        return Buckets(points.ranks, points.steps, points.values, points.values, points.values, points.times)

    def by_rank(self) -> Iterator[tuple[int, Buckets]]:
        """Each rank with its buckets."""
        import numpy as np

        if not len(self):
            return
        bounds = [0, *(np.flatnonzero(np.diff(self.ranks)) + 1).tolist(), len(self)]
        for start, end in itertools.pairwise(bounds):
            part = slice(start, end)
            yield int(self.ranks[start]), Buckets(*(column[part] for column in self.columns()))

    def columns(self) -> tuple[np.ndarray, ...]:
        return self.ranks, self.steps, self.mins, self.maxs, self.lasts, self.times


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


def chart_series(db: Session, *, run_id: int, key: str) -> tuple[int, tuple[int, int] | None] | None:
    """The series' id and its lowest and highest step (None without points); None when the run has no such series.

    One statement, for a chart's hot path: the series and the points of its first and last chunk, each found with
    one seek in the chunks' key.
    """
    rows = db.execute(
        text(
            "SELECT s.id, c.chunk, c.n, c.data FROM metric_series s LEFT JOIN metric_chunks c ON c.series_id = s.id"
            " AND c.chunk IN ((SELECT MIN(chunk) FROM metric_chunks WHERE series_id = s.id),"
            " (SELECT MAX(chunk) FROM metric_chunks WHERE series_id = s.id))"
            " WHERE s.run_id = :run_id AND s.key = :key"
        ),
        {"run_id": run_id, "key": key},
    ).all()
    if not rows:
        return None
    if rows[0].chunk is None:
        return rows[0].id, None
    ends = min(row.chunk for row in rows), max(row.chunk for row in rows)
    first = min(int(chunks.decode(row.data, row.n).steps[0]) for row in rows if row.chunk == ends[0])
    last = max(int(chunks.decode(row.data, row.n).steps[-1]) for row in rows if row.chunk == ends[1])
    return rows[0].id, (first, last)


def buckets(db: Session, *, series_id: int, chart: ChartPlan, rank: int | None, last_step: int) -> Buckets:
    """The chart's buckets of every rank (or of `rank`), by rank then step, of the points up to `last_step`: the
    series' highest, past which a coarse tier's bucket is still open (`merge_tiers`).

    Whole tier buckets are aggregated in SQL, each chart bucket's last value and time read from the tier row holding
    its last step; the part-filled tier buckets at the ends from finer tiers' whole buckets, and only the steps that
    no tier bucket covers (fewer than the finest tier's at each end, or a range too short for any) from the points.
    """
    spans, raw = _reads(chart, through=last_step)
    parts = [Buckets.of_points(chunks.read(db, series_id=series_id, first=first, last=last, rank=rank))
             for first, last in raw]  # fmt: skip
    if spans:
        parts.append(_tier_buckets(db, series_id=series_id, chart=chart, spans=spans, rank=rank))
    return _joined(parts, chart)


def _tier_buckets(
    db: Session, *, series_id: int, chart: ChartPlan, spans: Sequence[tuple[int, int, int]], rank: int | None
) -> Buckets:
    """The chart buckets that each span of whole tier buckets gives, all spans in one statement."""
    import numpy as np

    connection = db.connection()
    query = " UNION ALL ".join([_tier_query(rank is not None)] * len(spans)).replace("?", chunks.marker(connection))
    params = [value for tier, first, last in spans
              for value in (chart.origin // tier, chart.bucket_steps // tier, series_id, tier, first, last,
                            *([] if rank is None else [rank]), series_id, tier, tier)]  # fmt: skip
    # Through the driver's own cursor: a chart reads a thousand rows, and SQLAlchemy's Row for each took a tenth of
    # the chart's time.
    cursor = connection.connection.cursor()
    try:
        cursor.execute(query, params)
        rows = cursor.fetchall()
    finally:
        cursor.close()
    ranks, steps, lows, highs, lasts, times = zip(*rows, strict=True) if rows else ((),) * 6
    # None (NULL: NaN, see MetricPoint) becomes NaN in a float array.
    return Buckets(np.array(ranks, np.int64), np.array(steps, np.int64), np.array(lows, np.float64),
                   np.array(highs, np.float64), np.array(lasts, np.float64), np.array(times, np.float64))  # fmt: skip


def _reads(chart: ChartPlan, *, through: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """What the chart reads of its steps up to `through`: (tier, first bucket, last bucket) of whole tier buckets,
    and step ranges of points.

    The chart's tier for the inside of the range; at each end, what is left to each finer tier's whole buckets in
    turn. Each tier divides the chart's (they are powers of TIER_RATIO), so each of its buckets still lies in one
    chart bucket; an end that only part-fills a bucket of 65,536 steps reads a few rows, not a thousand chunks.
    """
    end = min(chart.end_step, through)
    left, spans = [(chart.start_step, end)] if chart.start_step <= end else [], []
    for tier in reversed([tier for tier in TIERS if chart.tier is not None and tier <= chart.tier]):
        rest = []
        for low, high in left:
            first, last = -(-low // tier), (high + 1) // tier - 1
            if first > last:
                rest.append((low, high))
                continue
            spans.append((tier, first, last))
            rest += [(a, b) for a, b in ((low, first * tier - 1), ((last + 1) * tier, high)) if a <= b]
        left = rest
    return spans, left


def _joined(parts: Sequence[Buckets], chart: ChartPlan) -> Buckets:
    """The parts as one bucket per rank and chart bucket: min and max ignoring NaN (NaN only where all are), and
    the value and time at the highest step. A tier row or a point is in one chart bucket: `plan` aligns them."""
    import numpy as np

    parts = [part for part in parts if len(part)]
    if not parts:
        return Buckets(*(np.empty(0, dtype) for dtype in (np.int64, np.int64, *[np.float64] * 4)))
    ranks, steps, lows, highs, lasts, times = (
        np.concatenate(c) for c in zip(*(p.columns() for p in parts), strict=True)
    )
    k = (steps - chart.origin) // chart.bucket_steps
    order = np.lexsort((steps, k, ranks))
    ranks, k, steps = ranks[order], k[order], steps[order]
    starts = np.flatnonzero(np.r_[True, (np.diff(ranks) != 0) | (np.diff(k) != 0)])
    ends = np.r_[starts[1:], len(steps)] - 1
    return Buckets(ranks[ends], steps[ends], np.fmin.reduceat(lows[order], starts),
                   np.fmax.reduceat(highs[order], starts), lasts[order][ends], times[order][ends])  # fmt: skip


def _tier_query(one_rank: bool) -> str:
    """Chart buckets from whole tier buckets, in the driver's positional parameters (written "?"): the tier's
    origin bucket, tier buckets per chart bucket, series_id, tier, first and last bucket, [rank], series_id, tier,
    tier."""
    return (
        "SELECT a.rank, a.last_step, a.min_value, a.max_value, t.last_value, t.last_time"
        " FROM (SELECT rank, (bucket - ?) / ? AS k, MIN(min_value) AS min_value,"
        "  MAX(max_value) AS max_value, MAX(last_step) AS last_step FROM metric_tiers"
        f"  WHERE series_id = ? AND tier = ? AND bucket BETWEEN ? AND ?{' AND rank = ?' if one_rank else ''}"
        "  GROUP BY rank, k) a"
        " JOIN metric_tiers t ON t.series_id = ? AND t.tier = ? AND t.bucket = a.last_step / ? AND t.rank = a.rank"
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
        select = _FROM_TIER.format(tier=tier, ratio=ratio, finer=finer, time=", l.last_time" if times else "",
                                   ranks=_PER_RANK)  # fmt: skip
        _upsert(db, f"INSERT INTO metric_tiers ({columns}) {select}{on_conflict}", in_finer)


def _upsert_parts(*, times: bool) -> tuple[str, str]:
    """The column list of a tier row, and the ON CONFLICT clause that overwrites all but its key."""
    values = ["min_value", "max_value", "last_step", "last_value", *(["last_time"] if times else [])]
    updates = ", ".join(f"{name} = excluded.{name}" for name in values)
    columns = ", ".join(["series_id", "tier", "bucket", "rank", *values])
    return columns, f" ON CONFLICT (series_id, tier, bucket, rank) DO UPDATE SET {updates}"


def _finest_rows(written: Sequence[chunks.Written]) -> list[tuple[Any, ...]]:
    """The finest tier's rows of the buckets that gained points, with NULL for NaN: all chunks in one pass."""
    import numpy as np

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
    rows = zip(series, bucket[starts].tolist(), ranks, nulls(lows), nulls(highs), steps[ends].tolist(),
               nulls(values[ends]), times[ends].tolist(), strict=True)  # fmt: skip
    return [(s, finest, b, rank, low, high, step, last, when) for s, b, rank, low, high, step, last, when in rows]


def nulls(values: np.ndarray) -> list[float | None]:
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
    names = "series_id, rank, first, last" if len(spans[0]) == 4 else "series_id, first, last"
    row = f"({','.join([marker] * len(spans[0]))})"
    for start in range(0, len(spans), SPANS_PER_STATEMENT):
        chunk = spans[start : start + SPANS_PER_STATEMENT]
        connection.exec_driver_sql(
            f"WITH touched ({names}) AS (VALUES {','.join([row] * len(chunk))}) {statement}",
            tuple(itertools.chain.from_iterable(chunk)),
        )


def merge_tiers(db: Session, written: Sequence[chunks.Written]) -> None:
    """Merges the chunks' added points into the finest tier, and into the coarser tiers' buckets already closed;
    then builds each coarser bucket that the added points close from the tier below it. Call it before merging the
    summaries, whose highest steps (the series' before these points) it reads; in the ingest transaction, the series
    locked (app.store.metrics.lock_series), so that no other writer closes a bucket meanwhile.

    Ingest's way (`refresh_tiers` rebuilds from what is stored instead, for a store being built). A bucket's min and
    max merge as min and max, its last value as the one of the higher step; every added point is new to its (series,
    rank), so merging is exact, and merging a point twice changes nothing. NaN is NULL here: a min or max of only NaN.
    A coarse bucket is read by charts only once closed (`buckets`): a trainer's points fill one an upsert per point
    in the finest tier and one statement at its end, where every tier took an upsert per point (bench/big_job.py).
    """
    written = [chunk for chunk in written if len(chunk.new.steps)]
    if not written:
        return
    connection = db.connection()
    highest = _Highest.of(connection, written)
    rows = _added_rows(written, highest.before[highest.of_chunk])
    columns, rebuild = _upsert_parts(times=True)
    chunks.insert_many(connection, f"INSERT INTO metric_tiers ({columns}) {{rows}}{_MERGE}", _TYPES, rows, key=4)
    for finer, tier in itertools.pairwise(TIERS):
        ratio = tier // finer
        in_finer = [(series_id, first * ratio, last * ratio + ratio - 1) for series_id, first, last
                    in highest.closing(tier)]  # fmt: skip
        if in_finer:
            select = _FROM_TIER.format(tier=tier, ratio=ratio, finer=finer, time=", l.last_time", ranks="")
            _upsert(db, f"INSERT INTO metric_tiers ({columns}) {select}{rebuild}", in_finer)


@dataclass(frozen=True)
class _Highest:
    """The series that chunks gained points in, ascending, with each one's highest step before and after them; and
    each chunk's series among them."""

    series: np.ndarray
    before: np.ndarray
    after: np.ndarray
    of_chunk: np.ndarray

    @staticmethod
    def of(connection: Connection, written: Sequence[chunks.Written]) -> _Highest:
        """Before: from the series' summary (read here), or one below its lowest added step where it had no point
        (no bucket below that holds one of it)."""
        import numpy as np

        series_of = np.array([chunk.series_id for chunk in written])
        firsts, lasts = (np.array([int(chunk.new.steps[end]) for chunk in written]) for end in (0, -1))
        order = np.argsort(series_of, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(series_of[order]) != 0])
        series = series_of[order][starts]
        lowest = np.minimum.reduceat(firsts[order], starts)
        tops = _highest_steps(connection, series.tolist())
        before = np.array([tops.get(s, low - 1) for s, low in zip(series.tolist(), lowest.tolist(), strict=True)])
        after = np.maximum(before, np.maximum.reduceat(lasts[order], starts))
        return _Highest(series, before, after, np.searchsorted(series, series_of))

    def closing(self, tier: int) -> list[Span]:
        """The (series, first, last) buckets of the tier that the added points close: from the one just above the
        series' highest step before them to the last wholly at or below its highest step after."""
        first, last = (self.before + 1) // tier, (self.after + 1) // tier - 1
        closes = first <= last
        return list(zip(self.series[closes].tolist(), first[closes].tolist(), last[closes].tolist(), strict=True))


def _highest_steps(connection: Connection, series_ids: Sequence[int]) -> dict[int, int]:
    """Each series' highest stored step, from its summary; a series without points has none. On PostgreSQL from an
    array, so that the statement's text is the same for any number of series (the driver parsed each list of
    markers anew: 6% of a big job's group there)."""
    if connection.dialect.name == "postgresql":
        query = "SELECT series_id, last_step FROM metric_summaries WHERE series_id = ANY(%b::integer[])"
        return dict(connection.exec_driver_sql(query, (pg_arrays.column(series_ids, "integer"),)).all())
    marker, found = chunks.marker(connection), dict[int, int]()
    for start in range(0, len(series_ids), SPANS_PER_STATEMENT):
        part = series_ids[start : start + SPANS_PER_STATEMENT]
        listed = ", ".join([marker] * len(part))
        query = f"SELECT series_id, last_step FROM metric_summaries WHERE series_id IN ({listed})"
        found.update(connection.exec_driver_sql(query, tuple(part)).all())
    return found


def _newer(column: str) -> str:
    return (
        f"CASE WHEN excluded.last_step > metric_tiers.last_step THEN excluded.{column} ELSE metric_tiers.{column} END"
    )


# A tier row's columns' SQL types, in `_upsert_parts` order.
_TYPES = ("integer", "integer", "bigint", "integer", "float8", "float8", "bigint", "float8", "float8")
# NULL (NaN) loses to any number; a comparison with NULL is NULL, which CASE takes as false.
_MERGE = (
    " ON CONFLICT (series_id, tier, bucket, rank) DO UPDATE SET"
    " min_value = CASE WHEN metric_tiers.min_value IS NULL OR excluded.min_value < metric_tiers.min_value"
    "  THEN excluded.min_value ELSE metric_tiers.min_value END,"
    " max_value = CASE WHEN metric_tiers.max_value IS NULL OR excluded.max_value > metric_tiers.max_value"
    "  THEN excluded.max_value ELSE metric_tiers.max_value END,"
    f" last_value = {_newer('last_value')}, last_time = {_newer('last_time')}, last_step = {_newer('last_step')}"
)


def _added_rows(written: Sequence[chunks.Written], closed_below: np.ndarray) -> list[tuple[Any, ...]]:
    """The rows that the added points alone make of each (series, tier, bucket, rank) they fall in: in the finest
    tier all, in a coarser one only those of buckets closed before them, which end at or below `closed_below` (each
    chunk's series' highest step before)."""
    import numpy as np

    steps, values, times = (np.concatenate(parts) for parts in zip(*(c.new.columns() for c in written), strict=True))
    owner = np.repeat(np.arange(len(written)), [len(chunk.new.steps) for chunk in written])
    series_of = np.array([chunk.series_id for chunk in written])
    rank_of = np.array([chunk.rank for chunk in written])
    below = closed_below[owner]
    rows: list[tuple[Any, ...]] = []
    for tier in TIERS:  # each chunk's steps ascend: a bucket's points are one run of them
        bucket = steps // tier
        ours, in_bucket, of = owner, bucket, (steps, values, times)
        if tier != TIERS[0]:
            late = bucket * tier + tier - 1 <= below
            if not late.any():  # the common case: every point in a bucket still open
                continue
            ours, in_bucket, of = owner[late], bucket[late], (steps[late], values[late], times[late])
        starts = np.flatnonzero(np.r_[True, (np.diff(in_bucket) != 0) | (np.diff(ours) != 0)])
        ends = np.r_[starts[1:], len(ours)] - 1
        lows, highs = np.fmin.reduceat(of[1], starts), np.fmax.reduceat(of[1], starts)
        rows += zip(series_of[ours[starts]].tolist(), [tier] * len(starts), in_bucket[starts].tolist(),
                    rank_of[ours[starts]].tolist(), nulls(lows), nulls(highs), of[0][ends].tolist(),
                    nulls(of[1][ends]), of[2][ends].tolist(), strict=True)  # fmt: skip
    return rows
