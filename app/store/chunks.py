"""Metric points, packed: a row of `metric_chunks` holds one rank's points of one series within SPAN steps.

A row per point cost 67 bytes on SQLite (the point, a rowid, a unique index and the live cursor's index), and no row
per point can reach a third of that: the key, a float64 value, a float64 time and SQLite's per-row header and cell
pointer already take 30. Packed, the key and header are paid once per SPAN steps, and the points are stored as
three columns (step deltas, values, times), each byte-shuffled (the first bytes of every point together, then the
second bytes...) and compressed with zlib: steps that advance by one compress to nothing, and the sign, exponent
and high mantissa bytes that the values and times of one chunk share to a few bits. A point then costs about 11
bytes (bench/runs_table.py), and it reads back bit for bit, NaN and infinities included.

The chunk of a step is step // SPAN, so where a point goes is fixed by its key: re-sending it finds it in its chunk
(stored once, the first value kept), and a point arriving late merges into its chunk whatever came in between.
Ingest rewrites only the chunks a batch touches; a trainer appending steps rewrites its last chunk, at most SPAN
points per rank.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection, bindparam, text
from sqlalchemy.orm import Session

# Steps per chunk: a multiple of the finest chart tier (app.store.charts), so a tier bucket never spans two chunks.
# Small enough that a chunk of a trainer's loss (about 9 bytes a point, 600 in all) fits in its B-tree page: SQLite
# moves what passes about 1,000 bytes to an overflow page of its own, and 256 steps a chunk wasted half of one.
SPAN = 64
# zlib's fastest level: on a trainer's loss and times, 9 saves under 1% more, at several times the CPU.
LEVEL = 1
# SQLite allows 32,766 parameters in one statement: 3 per chunk key.
KEYS_PER_STATEMENT = 8000
ChunkKey = tuple[int, int, int]  # (series_id, chunk, rank)


@dataclass(frozen=True)
class Points:
    """Points as four equally long arrays: int64 steps and ranks, float64 values (NaN as NaN) and unix times."""

    steps: np.ndarray
    ranks: np.ndarray
    values: np.ndarray
    times: np.ndarray

    @staticmethod
    def empty() -> Points:
        return Points(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), np.empty(0))

    def __len__(self) -> int:
        return len(self.steps)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.steps, self.ranks, self.values, self.times

    def take(self, index: Any) -> Points:
        """The points at `index` (a mask, a slice or positions)."""
        return Points(self.steps[index], self.ranks[index], self.values[index], self.times[index])

    @staticmethod
    def joined(parts: Sequence[Points]) -> Points:
        """The parts together, sorted by step, then rank."""
        if not parts:
            return Points.empty()
        steps, ranks, values, times = (np.concatenate(c) for c in zip(*(p.columns() for p in parts), strict=True))
        order = np.lexsort((ranks, steps))
        return Points(steps[order], ranks[order], values[order], times[order])


@dataclass(frozen=True)
class Column:
    """One rank's incoming points of one series: sorted by step, each step once."""

    steps: np.ndarray
    values: np.ndarray
    times: np.ndarray

    @staticmethod
    def of(steps: Sequence[int], values: Sequence[float], times: Sequence[float]) -> Column:
        """The points as sent; a step sent twice keeps its first point, as storing it twice would."""
        step_array = np.asarray(steps, dtype=np.int64)
        unique, first = np.unique(step_array, return_index=True)
        return Column(unique, np.asarray(values, dtype=np.float64)[first], np.asarray(times, dtype=np.float64)[first])


@dataclass(frozen=True)
class Written:
    """One chunk a batch changed: all its points now, and which of them the batch added."""

    series_id: int
    rank: int
    merged: Column
    added: np.ndarray  # bool mask over merged


def encode(steps: np.ndarray, values: np.ndarray, times: np.ndarray, level: int = LEVEL) -> bytes:
    """Steps (ascending; stored as deltas), values and times as one compressed, byte-shuffled blob; at `level` 0
    only framed, for data kept briefly."""
    n = len(steps)
    columns = np.empty((3, n), dtype="<f8")  # assigned through views: copies and casts cost more than the zlib
    deltas = columns[0].view("<i8")
    deltas[:1] = steps[:1]
    np.subtract(steps[1:], steps[:-1], out=deltas[1:])
    columns[1], columns[2] = values, times
    return zlib.compress(columns.view(np.uint8).reshape(3, n, 8).transpose(0, 2, 1).tobytes(), level)


def decode(blob: bytes, n: int) -> Column:
    """What `encode` packed; `n` is its number of points."""
    shuffled = np.frombuffer(zlib.decompress(blob), dtype=np.uint8).reshape(3, 8, n)
    columns = shuffled.transpose(0, 2, 1).copy().view("<u8").reshape(3, n)
    return Column(np.cumsum(columns[0].view("<i8")), columns[1].view("<f8"), columns[2].view("<f8"))


def marker(connection: Connection) -> str:
    """The driver's parameter marker, for statements sent through it."""
    return "?" if connection.dialect.paramstyle == "qmark" else "%s"


def write(db: Session, columns: Mapping[tuple[int, int], Column]) -> list[Written]:
    """Stores each (series_id, rank)'s column, merged into the chunks already stored; returns the chunks it changed.

    A point whose (series, step, rank) is stored already is skipped. Call it inside the ingest transaction with the
    series locked (app.store.metrics.insert_points): it reads the chunks, then writes them back.
    """
    incoming: dict[ChunkKey, Column] = {}
    for (series_id, rank), column in columns.items():
        chunk_of = column.steps // SPAN
        bounds = np.flatnonzero(np.diff(chunk_of)) + 1
        for part in np.split(np.arange(len(chunk_of)), bounds):
            if len(part):
                piece = Column(column.steps[part], column.values[part], column.times[part])
                incoming[(series_id, int(chunk_of[part[0]]), rank)] = piece
    stored = _read_chunks(db, incoming.keys())
    written, rows = [], []
    for key, new in incoming.items():
        merged, added = _merged(stored.get(key), new)
        if not added.any():
            continue
        written.append(Written(key[0], key[2], merged, added))
        blob = encode(merged.steps, merged.values, merged.times)
        rows.append((*key, len(merged.steps), float(merged.times.min()), blob))
    if rows:
        connection = db.connection()
        connection.exec_driver_sql(
            "INSERT INTO metric_chunks (series_id, chunk, rank, n, first_time, data)"
            f" VALUES ({', '.join([marker(connection)] * 6)}) ON CONFLICT (series_id, chunk, rank) DO UPDATE"
            " SET n = excluded.n, first_time = excluded.first_time, data = excluded.data",
            rows,
        )
    return written


def _merged(old: Column | None, new: Column) -> tuple[Column, np.ndarray]:
    """A chunk's points with the new ones whose step it lacks, and a mask of those over the result."""
    if old is None:
        return new, np.ones(len(new.steps), dtype=bool)
    if old.steps[-1] < new.steps[0]:  # a trainer appending: the common case, without a search or a sort
        steps = np.concatenate([old.steps, new.steps])
        merged = Column(steps, np.concatenate([old.values, new.values]), np.concatenate([old.times, new.times]))
        return merged, np.r_[np.zeros(len(old.steps), bool), np.ones(len(new.steps), bool)]
    fresh = ~np.isin(new.steps, old.steps, assume_unique=True)
    steps = np.concatenate([old.steps, new.steps[fresh]])
    order = np.argsort(steps, kind="stable")
    values = np.concatenate([old.values, new.values[fresh]])[order]
    times = np.concatenate([old.times, new.times[fresh]])[order]
    added = np.concatenate([np.zeros(len(old.steps), bool), np.ones(int(fresh.sum()), bool)])[order]
    return Column(steps[order], values, times), added


def _read_chunks(db: Session, keys: Iterable[ChunkKey]) -> dict[ChunkKey, Column]:
    connection = db.connection()
    mark = marker(connection)
    wanted = sorted(keys)
    found: dict[ChunkKey, Column] = {}
    for start in range(0, len(wanted), KEYS_PER_STATEMENT):
        part = wanted[start : start + KEYS_PER_STATEMENT]
        values = ",".join([f"({mark}, {mark}, {mark})"] * len(part))
        rows = connection.exec_driver_sql(
            f"WITH wanted (series_id, chunk, rank) AS (VALUES {values})"
            " SELECT c.series_id, c.chunk, c.rank, c.n, c.data FROM wanted w JOIN metric_chunks c"
            " ON c.series_id = w.series_id AND c.chunk = w.chunk AND c.rank = w.rank",
            tuple(value for key in part for value in key),
        ).all()
        found |= {(series_id, chunk, rank): decode(data, n) for series_id, chunk, rank, n, data in rows}
    return found


def read(db: Session, *, series_id: int, first: int, last: int, rank: int | None = None) -> Points:
    """The series' points with first <= step <= last (of one rank, or all), sorted by step, then rank."""
    query = (
        "SELECT rank, n, data FROM metric_chunks WHERE series_id = :series_id AND chunk BETWEEN :first AND :last"
        + ("" if rank is None else " AND rank = :rank")
    )
    params = {"series_id": series_id, "first": first // SPAN, "last": last // SPAN, "rank": rank}
    points = _points(db.execute(text(query), params).all())
    return points.take((points.steps >= first) & (points.steps <= last))


def _points(rows: Sequence[Any]) -> Points:
    """(rank, n, data) rows as Points, sorted by step, then rank."""
    parts = []
    for rank, n, data in rows:
        column = decode(data, n)
        parts.append(Points(column.steps, np.full(n, rank, np.int64), column.values, column.times))
    return Points.joined(parts)


def step_range(db: Session, *, series_id: int) -> tuple[int, int] | None:
    """The lowest and highest step of the series, any rank; None when it has no points."""
    # Two statements: SQLite answers a lone MIN or MAX with one seek, but MIN and MAX together with a scan.
    ends = [db.scalar(text(f"SELECT {end}(chunk) FROM metric_chunks WHERE series_id = :series_id"),
                      {"series_id": series_id}) for end in ("MIN", "MAX")]  # fmt: skip
    if ends[0] is None or ends[1] is None:
        return None
    first = read(db, series_id=series_id, first=ends[0] * SPAN, last=ends[0] * SPAN + SPAN - 1)
    last = read(db, series_id=series_id, first=ends[1] * SPAN, last=ends[1] * SPAN + SPAN - 1)
    return int(first.steps[0]), int(last.steps[-1])


def read_on_from(db: Session, *, series_id: int, step: int) -> int | None:
    """Where reading from `step` on finds points: `step` when its chunk holds some, else the first step of the next
    chunk that does; None when no chunk at or after it does (one seek, however wide the gap)."""
    chunk = db.scalar(
        text("SELECT MIN(chunk) FROM metric_chunks WHERE series_id = :series_id AND chunk >= :chunk"),
        {"series_id": series_id, "chunk": step // SPAN},
    )
    return None if chunk is None else max(step, chunk * SPAN)


def newest(db: Session, *, series_id: int, rank: int | None = None) -> Points:
    """The series' points in its highest chunk (of `rank`, or of any rank): the newest step is among them."""
    only_rank = "" if rank is None else " AND rank = :rank"
    top = db.scalar(
        text(f"SELECT MAX(chunk) FROM metric_chunks WHERE series_id = :series_id{only_rank}"),
        {"series_id": series_id, "rank": rank},
    )
    if top is None:
        return Points.empty()
    return read(db, series_id=series_id, first=top * SPAN, last=top * SPAN + SPAN - 1, rank=rank)


def newest_before(db: Session, *, series_id: int, before: float) -> Points:
    """The points logged before the unix time `before` in the series' highest chunk that has any."""
    top = db.scalar(
        text("SELECT MAX(chunk) FROM metric_chunks WHERE series_id = :series_id AND first_time < :before"),
        {"series_id": series_id, "before": before},
    )
    if top is None:
        return Points.empty()
    points = read(db, series_id=series_id, first=top * SPAN, last=top * SPAN + SPAN - 1)
    return points.take(points.times < before)


def count(db: Session, *, series_ids: Sequence[int]) -> int:
    """How many points these series hold."""
    if not series_ids:
        return 0
    query = text("SELECT SUM(n) FROM metric_chunks WHERE series_id IN :ids").bindparams(
        bindparam("ids", expanding=True)
    )
    return int(db.scalar(query, {"ids": list(series_ids)}) or 0)


def newest_points(db: Session, *, series_id: int, limit: int) -> Points:
    """The series' newest `limit` points (by step; any rank), sorted by step, then rank."""
    rows = db.execute(
        text("SELECT chunk, rank, n, data FROM metric_chunks WHERE series_id = :series_id ORDER BY chunk DESC"),
        {"series_id": series_id},
    )
    parts, found, enough_at = [], 0, None
    for chunk, rank, n, data in rows.yield_per(16):
        if enough_at is not None and chunk < enough_at:  # every rank of the chunk where `limit` was reached is read
            break
        parts.append((rank, n, data))
        found += n
        if found >= limit and enough_at is None:
            enough_at = chunk
    points = _points(parts)
    return points.take(slice(max(0, len(points) - limit), None))


def newest_of_each_rank(db: Session, *, series_id: int) -> Points:
    """The points of each rank's highest chunk of the series: one statement, however many ranks."""
    rows = db.execute(
        text(
            "SELECT c.rank, c.n, c.data FROM metric_chunks c JOIN (SELECT rank, MAX(chunk) AS top FROM metric_chunks"
            " WHERE series_id = :series_id GROUP BY rank) t ON c.rank = t.rank AND c.chunk = t.top"
            " WHERE c.series_id = :series_id"
        ),
        {"series_id": series_id},
    )
    return _points(rows.all())
