"""Metric series, their points (packed: app.store.chunks), and the log of new points that live pages read."""

from __future__ import annotations

import functools
import struct
import threading
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Insert, Table, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, lazyload, load_only

from app.core.models import MetricSeries, RecentHead, RecentPoints, Run
from app.store import chunks

if TYPE_CHECKING:
    import numpy as np

# How many of the newest points the log for live pages keeps (`points_after`): about 25 MB. A page that falls
# further behind than that (hours away at the rates trainers send) is told so, and reads its charts again.
RECENT_POINTS = 1_000_000
# The advisory lock that numbers the log's rows in commit order on PostgreSQL: any fixed number of our own.
RECENT_LOCK = 0x52616E6B  # "Rank"
# A log row's blob's first byte (after app.store.chunks' own kinds).
LOGGED = 0x04

RECENT: Table = RecentPoints.__table__  # type: ignore[assignment]
HEAD: Table = RecentHead.__table__  # type: ignore[assignment]
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


class SeriesPoint(NamedTuple):
    """A point of a series as read back by step."""

    step: int
    rank: int
    value: float
    time: float


# What ingest reads of a run, once per group of batches: not its config, command, nor the `gpus` inventory of every
# node (a JSON document that grows with the job, decoded on every post before).
_INGEST_COLUMNS = (
    Run.id, Run.created_at, Run.status, Run.launcher, Run.script, Run.token_hash, Run.started_at, Run.finished_at,
    Run.deleting_at, Run.epoch, Run.step, Run.total_steps, Run.samples_per_s, Run.heartbeat_at, Run.contact_at,
    Run.stop_requested_at, Run.dump_request, Run.dump_requested_at,
)  # fmt: skip


# Built once: its options took longer to build than the query to run, once per group of batches.
_INGEST_RUN = select(Run).options(load_only(*_INGEST_COLUMNS), lazyload("*")).where(Run.id == bindparam("run_id"))


def ingest_run(db: Session, run_id: int) -> Run | None:
    """The run with what ingest needs of it loaded (the rest loads if asked for); None when there is none."""
    return db.scalar(_INGEST_RUN, {"run_id": run_id})


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


SeriesKey = tuple[int, object, str]  # a series named by its run's id and creation time, and its key
SeriesKeys = dict[SeriesKey, int]


class SeriesIds:
    """Series ids by run and key, kept by one server process: a series keeps its id until its run is deleted, so
    only a key not seen yet costs a statement (`series_ids`, which another process may have beaten to it).

    A run is named by its id and its creation time: SQLite gives a deleted run's id to the next run made, whose
    series are new. `limit` bounds the memory: past it the cache starts again empty (a series is ~150 bytes).
    """

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._ids: SeriesKeys = {}
        self._lock = threading.Lock()  # PostgreSQL's writers share one cache

    def of(
        self, db: Session, *, run_id: int, made: object, keys: Iterable[str], new: MutableMapping[SeriesKey, int]
    ) -> dict[str, int]:
        """The series id of each key of the run made at `made`, creating the series that do not exist yet; those
        not kept yet are added to `new`, for the caller to `keep` once its transaction has committed (until then
        another writer must not use them, nor at all if it rolls back)."""
        found, missing = {}, []
        for key in keys:
            series_id = self._ids.get((run_id, made, key)) or new.get((run_id, made, key))
            if series_id is None:
                missing.append(key)
            else:
                found[key] = series_id
        if missing:
            created = series_ids(db, run_id=run_id, keys=missing)
            new.update({(run_id, made, key): series_id for key, series_id in created.items()})
            found |= created
        return found

    def keep(self, new: Mapping[SeriesKey, int]) -> None:
        """Keeps series ids that a committed transaction found or created."""
        with self._lock:
            if len(self._ids) + len(new) > self.limit:
                self._ids.clear()
            self._ids.update(new)

    def forget(self, run_id: int) -> None:
        """Drops the run's series (a statement on them failed: the run may be being deleted)."""
        with self._lock:
            self._ids = {key: value for key, value in self._ids.items() if key[0] != run_id}


def hold_writes(db: Session) -> None:
    """On SQLite, takes the database's write lock now, for the rest of the transaction: a transaction that reads
    first (or opens a savepoint) and writes later cannot wait for the lock when another writer committed meanwhile:
    it fails at once with "database is locked". A write, as app.store.runs.reread_locked does; nothing on PostgreSQL.
    """
    if db.get_bind().dialect.name == "sqlite":
        db.connection().exec_driver_sql("UPDATE metric_recent_head SET head = head WHERE id = 1")  # once a group


def lock_series(db: Session, series: Iterable[int]) -> None:
    """Holds the series for writing until the commit on PostgreSQL (`lock_runs`: their runs' rows), whose concurrent
    transactions would otherwise both read a chunk and both write it back, one losing the other's points, or close
    a chart tier's bucket without the other's. SQLite needs none: its one writer holds the database."""
    if db.get_bind().dialect.name == "postgresql":
        lock_runs(db, db.scalars(select(SERIES.c.run_id).where(SERIES.c.id.in_(set(series))).distinct()))


def lock_runs(db: Session, run_ids: Iterable[int]) -> None:
    """Holds the runs' rows until the commit on PostgreSQL, in id order (so two writers never wait on each other in
    a circle): every writer of a series holds its run first. One lock a run, where a GPU node's post locked ~90
    series; and taken before the group reads its runs, which it read before locking their series, so that it could
    write back a run's progress as it was before another group's commit. Nothing on SQLite."""
    if db.get_bind().dialect.name == "postgresql":
        db.execute(select(Run.id).where(Run.id.in_(set(run_ids))).order_by(Run.id).with_for_update())


def insert_points(
    db: Session,
    columns: Mapping[tuple[int, int], chunks.Column],
    *,
    log: bool = True,
    locked: bool = False,
    append: bool = False,
) -> list[chunks.Written]:
    """Stores each (series_id, rank)'s points, skipping those already stored; returns the chunks that changed.

    The series are locked first (`lock_series`) unless the caller has (`locked`). The new points are also logged for
    live pages (`points_after`), unless the caller logs them itself (`log=False`: `log_recent` once for several
    batches, by run, as the ingest writer's group does). `append`: as ingest stores them (app.store.chunks.write).
    """
    if not locked:
        lock_series(db, {series_id for series_id, _rank in columns})
    written = chunks.write(db, columns, samples=True, append=append)
    if log:
        log_recent(db, _by_run(db, written))
    return written


def _by_run(db: Session, written: Sequence[chunks.Written]) -> dict[int, list[chunks.Written]]:
    """The chunks by their series' run."""
    series = select(SERIES.c.id, SERIES.c.run_id).where(SERIES.c.id.in_({chunk.series_id for chunk in written}))
    run_of = dict(db.execute(series).all())
    by_run: dict[int, list[chunks.Written]] = {}
    for chunk in written:
        by_run.setdefault(run_of[chunk.series_id], []).append(chunk)
    return by_run


def log_recent(db: Session, written: Mapping[int, Sequence[chunks.Written]]) -> None:
    """Logs the points just added to each run's chunks, a row for each run (`LOGGED`), numbered on from the log's
    last point; forgets all but the newest RECENT_POINTS. A GPU node's post adds a point to each of ~90 (series,
    rank): a row for each was a sixth of the ingest writer's time, 0.46 ms a post (0.13 now, bench/big_job.py).

    On PostgreSQL a lock held to the commit numbers the rows in commit order, so a live page that saw a row has seen
    every row numbered before it (with a sequence, a transaction committing later could add a lower number).
    """
    added = {run_id: new for run_id, chunks_written in written.items()
             if (new := [chunk for chunk in chunks_written if len(chunk.new.steps)])}  # fmt: skip
    if not added:
        return
    connection = db.connection()
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(%s)", (RECENT_LOCK,))
    marker = chunks.marker(connection)
    top = connection.exec_driver_sql("SELECT head FROM metric_recent_head WHERE id = 1").scalar_one()
    rows = []
    for run_id, new in added.items():
        n, data = _logged(new)
        top += n
        rows.append((top, run_id, n, data))
    insert = f"INSERT INTO metric_recent (id, run_id, n, data) VALUES ({', '.join([marker] * 4)})"
    connection.exec_driver_sql(insert, rows)
    connection.exec_driver_sql(f"UPDATE metric_recent_head SET head = {marker} WHERE id = 1", (top,))
    connection.exec_driver_sql(f"DELETE FROM metric_recent WHERE id <= {marker}", (top - RECENT_POINTS,))


def _logged(written: Sequence[chunks.Written]) -> tuple[int, bytes]:
    """A log row's points and blob: LOGGED, the number of columns, each column's (series, rank, points) as
    `_head_type`, then their points as raw records (chunks.RECORD), column after column. All records made at once:
    numpy's cost is per call, and a column is often one point."""
    import numpy as np

    head = np.empty(len(written), _head_type())
    head["series_id"] = [chunk.series_id for chunk in written]
    head["rank"] = [chunk.rank for chunk in written]
    head["n"] = [len(chunk.new.steps) for chunk in written]
    data = chunks.records(*(np.concatenate(column) for column in zip(*(c.new.columns() for c in written), strict=True)))
    return int(head["n"].sum()), struct.pack("<BI", LOGGED, len(head)) + head.tobytes() + data


def _log_columns(data: bytes | memoryview) -> tuple[np.ndarray, int]:
    """A log row's columns (series_id, rank, n) and where their records start in its blob."""
    import numpy as np

    _kind, count = struct.unpack_from("<BI", data)
    head = np.frombuffer(data, _head_type(), count, offset=5)
    return head, 5 + head.nbytes


@functools.cache
def _head_type() -> np.dtype[Any]:
    import numpy as np

    return np.dtype([("series_id", "<i8"), ("rank", "<i4"), ("n", "<i4")])


def series_keys(db: Session, *, run_id: int) -> list[str]:
    return list(db.scalars(select(SERIES.c.key).where(SERIES.c.run_id == run_id).order_by(SERIES.c.key)))


def find_series(db: Session, *, run_id: int, key: str) -> int | None:
    return db.scalar(select(SERIES.c.id).where(SERIES.c.run_id == run_id, SERIES.c.key == key))


def points_in_range(
    db: Session, *, run_id: int, key: str, start_step: int, start_rank: int, end_step: int | None, limit: int
) -> list[SeriesPoint]:
    """Points of one series from (start_step, start_rank) on, up to end_step, by step then rank."""
    series_id = find_series(db, run_id=run_id, key=key)
    stored = None if series_id is None else chunks.step_range(db, series_id=series_id)
    if series_id is None or stored is None:
        return []
    first, end = max(start_step, stored[0]), stored[1] if end_step is None else min(end_step, stored[1])
    # Read in windows of steps, each four times the one before, until `limit` points: a page of a long series
    # decodes a few chunks past its end, not the series.
    parts, found, window = [], 0, chunks.SPAN * (limit // chunks.SPAN + 1)
    while first <= end and found < limit:
        last = min(end, first + window - 1)
        points = chunks.read(db, series_id=series_id, first=first, last=last)
        points = points.take((points.steps > start_step) | (points.ranks >= start_rank))
        parts.append(points)
        found += len(points)
        first, window = last + 1, window * 4
    page = chunks.Points.joined(parts).take(slice(0, limit))
    return [SeriesPoint(*point) for point in zip(*(column.tolist() for column in page.columns()), strict=True)]


def points_after(db: Session, *, run_id: int, after_id: int, limit: int) -> list[StoredPoint]:
    """Points of every series of the run logged after the point with id `after_id`, in the order they came: `limit`
    or a few more (whole logged rows). A cursor older than the log's RECENT_POINTS gets what the log still holds."""
    return watched_points_after(db, run_id=run_id, after_id=after_id, limit=limit, watch=None)[0]


def watched_points_after(
    db: Session,
    *,
    run_id: int,
    after_id: int,
    limit: int,
    watch: frozenset[str] | None,
    keys: MutableMapping[int, str] | None = None,
) -> tuple[list[StoredPoint], set[str]]:
    """As points_after, of the `watch` keys only (all with None), and the other keys that got points meanwhile: their
    points are not decoded, which is most of what a live page of 200 charts cost to feed. `keys` keeps the run's
    series keys by id between calls (a live page's stream): a series never changes its key."""
    keys = {} if keys is None else keys
    query = select(RECENT.c.id, RECENT.c.n, RECENT.c.data).where(RECENT.c.run_id == run_id, RECENT.c.id > after_id)
    found: list[StoredPoint] = []
    others: set[str] = set()
    for last_id, n, data in db.execute(query.order_by(RECENT.c.id)).yield_per(16):
        head, offset = _log_columns(data)
        series = head["series_id"].tolist()
        if not keys.keys() >= set(series):
            keys.update(db.execute(select(SERIES.c.id, SERIES.c.key).where(SERIES.c.run_id == run_id)).all())
        first_id = last_id - n + 1
        for series_id, rank, size in zip(series, head["rank"].tolist(), head["n"].tolist(), strict=True):
            key, start, offset = keys[series_id], offset, offset + size * chunks.RECORD.size
            first_id += size
            if first_id - 1 <= after_id:  # a row the last call ended in: its columns read then
                continue
            if watch is not None and key not in watch:
                others.add(key)
                continue
            column = chunks.from_records(memoryview(data)[start:offset])
            ids = range(first_id - size, first_id)
            rows = zip(ids, column.steps.tolist(), column.values.tolist(), column.times.tolist(), strict=True)
            found += [StoredPoint(id_, key, step, rank, value, time) for id_, step, value, time in rows
                      if id_ > after_id]  # fmt: skip
        if len(found) >= limit:
            break
    return found, others


def last_value(db: Session, *, run_id: int, key: str) -> float | None:
    """The value at the highest step of a series (rank 0), or None when it has no points."""
    series_id = find_series(db, run_id=run_id, key=key)
    newest = chunks.Points.empty() if series_id is None else chunks.newest(db, series_id=series_id, rank=0)
    return float(newest.values[-1]) if len(newest) else None


def last_point_id(db: Session) -> int:
    """The newest logged point's id of any run, 0 without any: where a freshly loaded page's live stream starts.

    Any run's, not only the page's: ids are one sequence, so everything of this run up to it is already in what the
    page's charts read. Read before the points after a cursor, a poll that finds none can move its cursor here: on
    PostgreSQL each statement sees its own snapshot, and every point numbered up to it was committed before.
    """
    return db.scalar(select(HEAD.c.head).where(HEAD.c.id == 1)) or 0


def first_kept_id(db: Session) -> int:
    """The id of the oldest point the log still holds (the next point's when it holds none): a cursor before it
    has missed the points numbered in between, dropped from the log (or gone with their run)."""
    oldest = db.execute(select(RECENT.c.id, RECENT.c.n).order_by(RECENT.c.id).limit(1)).first()
    return oldest.id - oldest.n + 1 if oldest else last_point_id(db) + 1
