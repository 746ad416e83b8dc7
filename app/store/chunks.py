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

A chunk whose values are all decimals of up to MAX_DECIMALS digits (GPU and system samples: whole percents, degrees,
MHz and bytes, watts from NVML's milliwatts, psutil's one-decimal percent) is written as a time-series database
writes samples, when ingest asks for it (the first byte says which format a blob is; 0021 converts a store's
samples): the steps, the times' float64 bits and the values as whole numbers of 10**-decimals, each as differences
less their least (a sampler's steps go up a second at a time, and its times by about a second: what is left is the
sampler's jitter), byte-shuffled and deflated. It reads back bit for bit. A GPU node's samples then take 2.9 bytes a
point where they took 4.8, a host's 3.9 where they took 6.0 (bench/samples_codec.py); nearly all of what is left is
the times' jitter, which a point's exact float64 time keeps. A noisy float (a loss) fails the decimal test at its
first value and keeps the shuffled floats, byte for byte as before.

Ingest appends (`write` with `append`): a post that adds steps after a chunk's last one adds them as raw records
after its packed points, without unpacking or packing them again (a GPU node's post adds one point to each of ~90
chunks, and that packing was a third of the server's CPU at 1,024 GPUs). Past TAIL_MAX records, or when a point
lands before the chunk's last, the chunk is packed whole again. A chunk starts as raw records alone; the chunk
before it is packed whole when it first is (within TAIL_MAX points), or at once if it is records alone (a sparse
series'), so a tail remains only on each (series, rank)'s two newest chunks (and on an older one that points came
late to).

numpy is imported by the functions that use it, not at import: it was a tenth of an idle server's memory, and a
server that only serves pages never needs it.
"""

from __future__ import annotations

import functools
import itertools
import math
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.orm import Session

from app.core import pg_arrays

if TYPE_CHECKING:
    import numpy as np

# Steps per chunk: a multiple of the finest chart tier (app.store.charts), so a tier bucket never spans two chunks.
# Small enough that a chunk of a trainer's loss (about 9 bytes a point, 600 in all) fits in its B-tree page: SQLite
# moves what passes about 1,000 bytes to an overflow page of its own, and 256 steps a chunk wasted half of one.
SPAN = 64
# zlib's fastest level: on a trainer's loss and times, 9 saves under 1% more, at several times the CPU.
LEVEL = 1
# SQLite allows 32,766 parameters in one statement: 3 per chunk key.
KEYS_PER_STATEMENT = 8000
# A blob's first byte: zlib's header for shuffled float columns (every chunk before 0021), SAMPLES for
# integer-coded samples (the byte after it: their decimal digits), TAILED for packed points with raw records
# appended (the 4 bytes after it: the packed part's length), RECORDS for raw records alone (the live pages' log
# before 0026).
SHUFFLED = 0x78
SAMPLES = 0x01
TAILED = 0x02
RECORDS = 0x03
# A raw record: the step (int64), the value and the time (float64), little-endian.
RECORD = struct.Struct("<qdd")
# The most records a chunk's tail holds before the chunk is packed whole again (`tail_max`: up to STAGGER less, by
# the chunk): a tail costs 24 bytes a point where a packed sample costs ~3, and packing 64 points costs about what
# packing one does (numpy's cost per call). A chunk starts as records alone.
TAIL_MAX = 20
STAGGER = 8  # `tail_max`
# The most decimal digits a sample's values may have: NVML's milliwatts as watts.
MAX_DECIMALS = 3
ChunkKey = tuple[int, int, int]  # (series_id, chunk, rank)
K = TypeVar("K")


@dataclass(frozen=True)
class Points:
    """Points as four equally long arrays: int64 steps and ranks, float64 values (NaN as NaN) and unix times."""

    steps: np.ndarray
    ranks: np.ndarray
    values: np.ndarray
    times: np.ndarray

    @staticmethod
    def empty() -> Points:
        import numpy as np

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
        import numpy as np

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
        import numpy as np

        step_array = np.asarray(steps, dtype=np.int64)
        value_array, time_array = np.asarray(values, dtype=np.float64), np.asarray(times, dtype=np.float64)
        if len(step_array) < 2 or (step_array[1:] > step_array[:-1]).all():  # as trainers send: np.unique sorts
            return Column(step_array, value_array, time_array)
        unique, first = np.unique(step_array, return_index=True)
        return Column(unique, value_array[first], time_array[first])

    @staticmethod
    def many(points: Mapping[K, tuple[list[int], list[float], list[float]]]) -> dict[K, Column]:
        """`of` for each, the arrays cut from one array per field: numpy's cost is per call, and a GPU node's post is
        ~90 columns of a point or two (bench/big_job.py)."""
        import numpy as np

        sizes = [len(steps) for steps, _, _ in points.values()]
        all_steps, all_values, all_times = [], [], []
        for part_steps, part_values, part_times in points.values():
            all_steps += part_steps
            all_values += part_values
            all_times += part_times
        steps, values, times = np.array(all_steps, np.int64), np.array(all_values, float), np.array(all_times, float)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        # A step not above the one before it, other than a column's first: its column is sorted and deduplicated.
        back = np.flatnonzero(steps[1:] <= steps[:-1]) + 1
        owners = np.searchsorted(ends, back, side="right")
        unsorted = set(owners[starts[owners] != back].tolist())
        cut = zip(points.items(), starts.tolist(), ends.tolist(), strict=True)
        return {key: Column.of(*part) if n in unsorted else Column(steps[start:end], values[start:end],
                times[start:end]) for n, ((key, part), start, end) in enumerate(cut)}  # fmt: skip

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.steps, self.values, self.times


@dataclass(frozen=True)
class Written:
    """One chunk a batch changed: all its points now (or, appended to it, the points added alone: `write`), and which
    of them the batch added."""

    series_id: int
    rank: int
    merged: Column
    added: np.ndarray  # bool mask over merged
    new: Column = None  # type: ignore[assignment]  # the added points alone: made from the two above if not given

    def __post_init__(self) -> None:
        if self.new is None:
            added = self.added
            object.__setattr__(self, "new", Column(*(column[added] for column in self.merged.columns())))


def combined(written: Sequence[Written]) -> list[Written]:
    """Chunks written by several batches of one transaction as each chunk once: the points of all of them, with
    every point any of them added marked as added."""
    import numpy as np

    latest: dict[ChunkKey, Written] = {}
    for chunk in written:
        key = (chunk.series_id, int(chunk.merged.steps[0]) // SPAN, chunk.rank)
        before = latest.get(key)
        if before is not None:
            merged, _ = _merged(before.merged, chunk.merged)
            new, _ = _merged(before.new, chunk.new)
            chunk = Written(key[0], key[2], merged, np.isin(merged.steps, new.steps), new)
        latest[key] = chunk
    return list(latest.values())


def encode(
    steps: np.ndarray, values: np.ndarray, times: np.ndarray, level: int = LEVEL, *, samples: bool = False
) -> bytes:
    """Steps (ascending), values and times as one compressed blob of byte-shuffled floats, or with `samples` as
    samples where the values allow it; at `level` 0 only framed, for data kept briefly."""
    import numpy as np

    if samples and (found := _decimals(values)) is not None:
        return _encode_samples(steps, times, *found)
    n = len(steps)
    columns = np.empty((3, n), dtype="<f8")  # assigned through views: copies and casts cost more than the zlib
    deltas = columns[0].view("<i8")
    deltas[:1] = steps[:1]
    np.subtract(steps[1:], steps[:-1], out=deltas[1:])
    columns[1], columns[2] = values, times
    return zlib.compress(columns.view(np.uint8).reshape(3, n, 8).transpose(0, 2, 1).tobytes(), level)


def decode(blob: bytes | memoryview, n: int) -> Column:
    """What `encode` packed; `n` is its number of points."""
    import numpy as np

    if blob[0] == SAMPLES:
        return _decode_samples(blob, n)
    if blob[0] == RECORDS:
        return from_records(memoryview(blob)[1:])
    if blob[0] == TAILED:
        (size,) = struct.unpack_from("<I", blob, 1)
        head, tail = memoryview(blob)[5 : 5 + size], from_records(memoryview(blob)[5 + size :])
        packed = decode(head, n - len(tail.steps))  # every step of a tail comes after them
        return Column(*(np.concatenate(pair) for pair in zip(packed.columns(), tail.columns(), strict=True)))
    columns = _unshuffled(zlib.decompress(blob), n)
    return Column(np.cumsum(columns[0].view("<i8")), columns[1].view("<f8"), columns[2].view("<f8"))


def records(steps: np.ndarray, values: np.ndarray, times: np.ndarray) -> bytes:
    """Points as raw records (RECORD), unpacked: for a chunk's tail, and data kept briefly."""
    import numpy as np

    out = np.empty(len(steps), _record_type())
    out["step"], out["value"], out["time"] = steps, values, times
    return out.tobytes()


def from_records(data: memoryview) -> Column:
    """Raw records (`records`) as a column."""
    import numpy as np

    found = np.frombuffer(data, _record_type())
    return Column(*(np.ascontiguousarray(found[name]) for name in ("step", "value", "time")))


@functools.cache
def _record_type() -> np.dtype[Any]:
    import numpy as np

    return np.dtype([("step", "<i8"), ("value", "<f8"), ("time", "<f8")])


def _decimals(values: np.ndarray) -> tuple[int, np.ndarray] | None:
    """The fewest decimal digits, up to MAX_DECIMALS, in which every value is written exactly, with the values as
    whole numbers of 10**-digits: those divided by 10**digits give the values back bit for bit. None when no digits
    do (NaN, infinities, -0.0, a noisy float: that fails at its first value, at a tenth of the array's cost)."""
    import numpy as np

    first = float(values[0]) if len(values) else math.nan
    for digits in range(MAX_DECIMALS + 1):
        scale = 10.0**digits
        if not math.isfinite(first) or abs(first * scale) > 2**53 or round(first * scale) / scale != first:
            continue
        with np.errstate(over="ignore"):  # a value near the float's limit overflows to infinity, refused below
            whole = np.rint(values * scale)
        if not np.abs(whole).max() <= 2**53:  # NaN and infinities too: a cast of them would warn
            continue
        numbers = whole.astype("<i8")
        # Compared as the decoder will make them, from whole numbers: -0.0 and 0.0 are one whole number.
        if ((numbers / scale).view("<i8") == values.view("<i8")).all():
            return digits, numbers
    return None


def _encode_samples(steps: np.ndarray, times: np.ndarray, decimals: int, numbers: np.ndarray) -> bytes:
    """A head of six numbers (the first step, the first time's bits less those of the first step as a float, the
    first whole value, and the least difference of each), then the differences of the steps, of the times' bits and
    of the whole values, each less its least: a sampler's period, as a whole number of the times' last bit, leaves
    only its jitter. All of it wraps around 2**64, so any bits come back."""
    import numpy as np

    columns = np.empty((3, len(steps)), "<i8")
    columns[0], columns[1], columns[2] = steps, np.ascontiguousarray(times, "<f8").view("<i8"), numbers
    changes = np.subtract(columns[:, 1:], columns[:, :-1])  # np.diff, without its checks: a chunk is small
    least = changes.min(axis=1) if changes.shape[1] else np.zeros(3, "<i8")
    changes -= least[:, None]
    offset = _wrapped(int(columns[1, 0]) - _float_bits(int(columns[0, 0])))
    head = struct.pack("<6q", columns[0, 0], offset, columns[2, 0], *least.tolist())
    body = changes.view(np.uint8).reshape(3, -1, 8).transpose(0, 2, 1).tobytes()
    # Raw deflate: zlib's header and checksum were 6 bytes a chunk.
    return bytes((SAMPLES, decimals)) + zlib.compress(head + body, LEVEL, wbits=-15)


def _decode_samples(blob: bytes | memoryview, n: int) -> Column:
    import numpy as np

    data = zlib.decompress(blob[2:], wbits=-15)
    first_step, offset, first_number, *least = struct.unpack_from("<6q", data)
    changes = np.empty((3, n - 1), "<i8")
    changes.view(np.uint8).reshape(3, n - 1, 8)[...] = (
        np.frombuffer(data, np.uint8, offset=48).reshape(3, 8, n - 1).transpose(0, 2, 1)
    )
    columns = np.empty((3, n), "<i8")
    columns[:, 0] = first_step, _wrapped(_float_bits(first_step) + offset), first_number
    np.add(changes, np.array(least, "<i8")[:, None], out=columns[:, 1:])
    np.cumsum(columns, axis=1, out=columns)  # wraps as the differences did
    return Column(columns[0], columns[2] / 10.0 ** blob[1], columns[1].view("<f8"))


def _float_bits(step: int) -> int:
    """The bits of the step as a float64, as a signed 64-bit number: what a sample's time is written against."""
    return int(struct.unpack("<q", struct.pack("<d", float(step)))[0])


def _wrapped(number: int) -> int:
    """A Python integer as the signed 64-bit number it is modulo 2**64."""
    return (number + 2**63) % 2**64 - 2**63


def _unshuffled(data: bytes, n: int) -> np.ndarray:
    """Three byte-shuffled columns of n 8-byte numbers, as a (3, n) array of uint64."""
    import numpy as np

    shuffled = np.frombuffer(data, dtype=np.uint8).reshape(3, 8, n)
    return shuffled.transpose(0, 2, 1).copy().view("<u8").reshape(3, n)


def marker(connection: Connection) -> str:
    """The driver's parameter marker, for statements sent through it."""
    return "?" if connection.dialect.paramstyle == "qmark" else "%s"


def insert_many(
    connection: Connection, statement: str, types: Sequence[str], rows: Sequence[Sequence[Any]], *, key: int
) -> None:
    """Runs `statement`, an INSERT whose `{rows}` stands for where its rows come from, for all of `rows` (columns of
    the SQL `types`; the first `key` of them, its conflict key). On SQLite once per row: the driver's executemany,
    prepared once, a step a row. On PostgreSQL once for all, each column an array (`arrays`): a statement per row
    cost the server a bind and an execute each, more than the rows' own work, and the client as much again
    (bench/big_job.py). Rows that share a key go one by one there too: one statement cannot update a row twice."""
    if connection.dialect.name != "postgresql" or len({tuple(row[:key]) for row in rows}) < len(rows):
        values = f"VALUES ({', '.join([marker(connection)] * len(types))})"
        connection.exec_driver_sql(statement.format(rows=values), rows)
        return
    connection.exec_driver_sql(statement.format(rows=f"SELECT * FROM {arrays(types)}"), columns_of(rows, types))


def arrays(types: Sequence[str]) -> str:
    """PostgreSQL's rows from one array parameter per column (`columns_of`), of the SQL `types`. In the binary
    format: as text, the driver wrote each number through a regular expression (a fifth of a big job's group on
    PostgreSQL) and escaped each blob through another (80 us a chunk, 700 times the binary's cost; bench/big_job.py)."""
    return f"unnest({', '.join(f'%b::{type_}[]' for type_ in types)})"


def columns_of(rows: Sequence[Sequence[Any]], types: Sequence[str]) -> tuple[Any, ...]:
    """`rows` as one array parameter per column, for `arrays(types)` (app.core.pg_arrays)."""
    columns = zip(*rows, strict=True) if rows else ([] for _ in types)
    return tuple(pg_arrays.column(column, type_) for column, type_ in zip(columns, types, strict=True))


def write(
    db: Session, columns: Mapping[tuple[int, int], Column], *, samples: bool = False, append: bool = False
) -> list[Written]:
    """Stores each (series_id, rank)'s column, merged into the chunks already stored; returns the chunks it changed.

    A point whose (series, step, rank) is stored already is skipped. Call it inside the ingest transaction with the
    series locked (app.store.metrics.insert_points): it reads the chunks, then writes them back. `samples` codes a
    chunk of short decimals as samples, as ingest does; without it every chunk is shuffled floats, as before 0021
    (0015 moves an old store through here, and 0018 reads what it wrote as such; 0021 converts the samples).
    `append`, as ingest does, adds steps after a chunk's last as its tail where it can: such a chunk's Written holds
    only the points added, not the chunk's others, so it cannot rebuild chart tiers (app.store.charts.refresh_tiers).
    """
    incoming = _by_chunk(columns)
    stored = _read_rows(db, incoming.keys(), _SAME_CHUNK)
    before = _read_rows(db, [key for key in incoming if key not in stored], _CHUNK_BEFORE) if append else {}
    unpacked: dict[ChunkKey, Column] = {}
    tails = _tails(incoming, stored, before, unpacked) if append else {}
    if append:
        before = _packed_before(db, incoming, stored, tails, before)
    written, rows = [], []
    for key, new in incoming.items():
        row, old = stored.get(key), unpacked.get(key)
        if key in tails:
            written.append(Written(key[0], key[2], new, _all_added()[: len(new.steps)], new))
            rows.append((*key, *tails[key]))
            continue
        if row is not None and old is None:
            old = decode(row.data, row.n)
        merged, added = _merged(old, new)
        if not (added[-1] or added.any()):  # appended points make the last one new
            continue
        written.append(Written(key[0], key[2], merged, added))
        rows.append((*key, len(merged.steps), float(merged.times.min()), encode(*merged.columns(), samples=samples)))
    for key, row in before.items():
        if key not in incoming:
            rows.append((*key, row.n, row.first_time, encode(*decode(row.data, row.n).columns(), samples=samples)))
    if rows:
        insert_many(db.connection(), _UPSERT, _UPSERT_TYPES, rows, key=3)
    return written


def _packed_before(
    db: Session,
    incoming: Mapping[ChunkKey, Column],
    stored: Mapping[ChunkKey, _Row],
    tails: Mapping[ChunkKey, object],
    before: Mapping[ChunkKey, _Row],
) -> dict[ChunkKey, _Row]:
    """The chunks before the new ones (`before`, read) and before those packed whole for the first time, to be packed
    whole now: each takes no more appends. One with a tail, once the chunk after it is first packed whole: a job's
    series all start a chunk in the same second, and packing all the chunks before them at once was twice the CPU
    of the seconds around it (bench/big_job.py); `tail_max` staggers the first packing. One that is records alone
    (a series too sparse to fill a tail) at once."""
    whole = [key for key in incoming if key not in tails and stored.get(key, _NEW).data[0] == RECORDS]
    found = {**before, **_read_rows(db, [key for key in whole if key in stored], _CHUNK_BEFORE)}
    firsts = {(series, rank) for series, _chunk, rank in whole}
    return {key: row for key, row in found.items()
            if row.data[0] == RECORDS or (row.data[0] == TAILED and (key[0], key[2]) in firsts)}  # fmt: skip


_UPSERT = (
    "INSERT INTO metric_chunks (series_id, chunk, rank, n, first_time, data) {rows}"
    " ON CONFLICT (series_id, chunk, rank) DO UPDATE SET n = excluded.n, first_time = excluded.first_time,"
    " data = excluded.data"
)
_UPSERT_TYPES = ("integer", "bigint", "integer", "integer", "float8", "bytea")


def _by_chunk(columns: Mapping[tuple[int, int], Column]) -> dict[ChunkKey, Column]:
    """Each column cut where its steps pass into another chunk."""
    import numpy as np

    incoming: dict[ChunkKey, Column] = {}
    for (series_id, rank), column in columns.items():
        if not len(column.steps):
            continue
        first = int(column.steps[0]) // SPAN
        if int(column.steps[-1]) // SPAN == first:  # a trainer's or sampler's batch: one chunk, no split
            incoming[(series_id, first, rank)] = column
            continue
        chunk_of = column.steps // SPAN
        bounds = np.flatnonzero(np.diff(chunk_of)) + 1
        for part in np.split(np.arange(len(chunk_of)), bounds):
            if len(part):
                piece = Column(column.steps[part], column.values[part], column.times[part])
                incoming[(series_id, int(chunk_of[part[0]]), rank)] = piece
    return incoming


class _Row(NamedTuple):
    n: int
    first_time: float
    data: bytes


_NEW = _Row(0, math.inf, bytes((RECORDS,)))  # a chunk not stored yet: it starts as records


def tail_max(key: ChunkKey) -> int:
    """The most records `key`'s chunk holds before it is packed whole: TAIL_MAX less up to STAGGER - 1, by the
    (series, rank). A GPU node's series all take a point a second, at the same steps: with one limit for all, every
    chunk of a 1,024-GPU job was packed again in the same second, twice the CPU of the seconds around it, and held
    the p99 of a post (bench/big_job.py)."""
    series_id, _chunk, rank = key
    return TAIL_MAX - (series_id * 3 + rank) % STAGGER


def _tails(
    incoming: Mapping[ChunkKey, Column],
    stored: Mapping[ChunkKey, _Row],
    before: Mapping[ChunkKey, _Row],
    unpacked: dict[ChunkKey, Column],
) -> dict[ChunkKey, tuple[int, float, bytes]]:
    """Each chunk's row (its points' count, first time, and blob with its new points as records after its last)
    where they all come after it, its tail stays within `tail_max` and it is not `before` a new chunk; a new chunk's
    as records alone, within the same; a chunk packed whole is unpacked to know (once per `tail_max` appends), into
    `unpacked`. The records and first times of all
    made at once: numpy's cost is per call, and a sampler's chunk gains a point a post (bench/big_job.py)."""
    import numpy as np

    heads: dict[ChunkKey, bytes] = {}
    for key, new in incoming.items():
        if key in before:
            continue
        row = stored.get(key, _NEW)
        if row.data[0] == TAILED:
            (size,) = struct.unpack_from("<I", row.data, 1)
            head, kept = row.data, (len(row.data) - 5 - size) // RECORD.size
        elif row.data[0] == RECORDS:
            head, kept = row.data, (len(row.data) - 1) // RECORD.size
        else:
            unpacked[key] = decode(row.data, row.n)
            head, kept = bytes((TAILED,)) + struct.pack("<I", len(row.data)) + row.data, 0
        last = (RECORD.unpack_from(row.data, len(row.data) - RECORD.size)[0] if kept
                else int(unpacked[key].steps[-1]) if key in unpacked else -1)  # fmt: skip
        if kept + len(new.steps) <= tail_max(key) and new.steps[0] > last:
            heads[key] = head
    if not heads:
        return {}
    news = [incoming[key] for key in heads]
    sizes = [len(new.steps) for new in news]
    ends = np.cumsum(sizes).tolist()
    steps, values, times = (np.concatenate(parts) for parts in zip(*(new.columns() for new in news), strict=True))
    data = records(steps, values, times)
    starts = [end - size for end, size in zip(ends, sizes, strict=True)]
    firsts = np.minimum.reduceat(times, starts).tolist()
    cut = zip(heads.items(), firsts, starts, ends, strict=True)
    return {key: (stored.get(key, _NEW).n + end - start, min(stored.get(key, _NEW).first_time, first),
                  head + data[start * RECORD.size : end * RECORD.size])
            for (key, head), first, start, end in cut}  # fmt: skip


@functools.cache
def _all_added() -> np.ndarray:
    import numpy as np

    mask = np.ones(TAIL_MAX, bool)
    mask.flags.writeable = False  # shared by every appended chunk's Written: read, never written
    return mask


def _merged(old: Column | None, new: Column) -> tuple[Column, np.ndarray]:
    """A chunk's points with the new ones whose step it lacks, and a mask of those over the result."""
    import numpy as np

    if old is None:
        return new, np.ones(len(new.steps), dtype=bool)
    if old.steps[-1] < new.steps[0]:  # a trainer appending: the common case, without a search or a sort
        steps = np.concatenate([old.steps, new.steps])
        merged = Column(steps, np.concatenate([old.values, new.values]), np.concatenate([old.times, new.times]))
        added = np.zeros(len(steps), bool)
        added[len(old.steps) :] = True
        return merged, added
    fresh = ~np.isin(new.steps, old.steps, assume_unique=True)
    steps = np.concatenate([old.steps, new.steps[fresh]])
    order = np.argsort(steps, kind="stable")
    values = np.concatenate([old.values, new.values[fresh]])[order]
    times = np.concatenate([old.times, new.times[fresh]])[order]
    added = np.concatenate([np.zeros(len(old.steps), bool), np.ones(int(fresh.sum()), bool)])[order]
    return Column(steps[order], values, times), added


# How `_read_rows` finds the stored chunk for a wanted (series_id, chunk, rank): that very chunk, or the (series,
# rank)'s highest one below it.
_SAME_CHUNK = "c.chunk = w.chunk"
_CHUNK_BEFORE = (
    "c.chunk = (SELECT MAX(b.chunk) FROM metric_chunks b"
    " WHERE b.series_id = w.series_id AND b.rank = w.rank AND b.chunk < w.chunk)"
)


def _read_rows(db: Session, keys: Iterable[ChunkKey], found_by: str) -> dict[ChunkKey, _Row]:
    """The stored chunk each wanted key finds (`found_by`), as stored (not unpacked), by the found chunk's key."""
    connection = db.connection()
    wanted = sorted(keys)
    found: dict[ChunkKey, _Row] = {}
    for start in range(0, len(wanted), KEYS_PER_STATEMENT):
        part = wanted[start : start + KEYS_PER_STATEMENT]
        table, params = _wanted(connection, part)
        rows = connection.exec_driver_sql(
            f"WITH wanted (series_id, chunk, rank) AS ({table})"
            " SELECT w.series_id, c.chunk, c.rank, c.n, c.first_time, c.data FROM wanted w JOIN metric_chunks c"
            f" ON c.series_id = w.series_id AND c.rank = w.rank AND {found_by}",
            params,
        ).all()
        found |= {(series, chunk, rank): _Row(n, first_time, bytes(data)) for series, chunk, rank, n, first_time, data
                  in rows}  # fmt: skip
    return found


def _wanted(connection: Connection, keys: Sequence[ChunkKey]) -> tuple[str, Sequence[Any]]:
    """Where the chunk keys' rows come from, and its parameters: on PostgreSQL three arrays, so that the statement's
    text is the same for any number of keys (the driver parsed a VALUES list of 17,000 markers anew each time: a
    quarter of a big job's group on PostgreSQL, bench/big_job.py); on SQLite a VALUES list."""
    if connection.dialect.name == "postgresql":
        return f"SELECT * FROM {arrays(_UPSERT_TYPES[:3])}", columns_of(keys, _UPSERT_TYPES[:3])
    mark = marker(connection)
    return "VALUES " + ",".join([f"({mark}, {mark}, {mark})"] * len(keys)), tuple(itertools.chain.from_iterable(keys))


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
    import numpy as np

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
    return steps_at_ends(db, series_id=series_id, first_chunk=ends[0], last_chunk=ends[1])


def steps_at_ends(db: Session, *, series_id: int, first_chunk: int, last_chunk: int) -> tuple[int, int]:
    """The lowest step in chunk `first_chunk` and the highest in `last_chunk` (both stored), any rank."""
    rows = db.execute(
        text("SELECT chunk, n, data FROM metric_chunks WHERE series_id = :series_id AND chunk IN (:first, :last)"),
        {"series_id": series_id, "first": first_chunk, "last": last_chunk},
    ).all()
    first = min(int(decode(data, n).steps[0]) for chunk, n, data in rows if chunk == first_chunk)
    last = max(int(decode(data, n).steps[-1]) for chunk, n, data in rows if chunk == last_chunk)
    return first, last


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
