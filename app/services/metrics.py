"""Metrics: take a trainer's batch (idempotently), and read series back."""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from pydantic import ValidationError
from rankboard import wire
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from app.auth.passwords import sha256
from app.core.errors import InvalidToken, RankboardError, RunNotActive, RunNotFound, SeriesNotFound
from app.core.models import Run, RunStatus, utcnow
from app.launcher.launchers import kind
from app.schemas.metrics import BatchIn, IngestResult, PointOut, SeriesOut
from app.services import dump_requests, external, nodes, runs
from app.services.lifecycle import transitions
from app.store import charts as chart_store
from app.store import chunks
from app.store import metrics as metric_store
from app.store import ranks as rank_store
from app.store import runs as run_store
from app.store import summaries as summary_store
from app.store.metrics import SeriesIds, SeriesKeys, SeriesPoint, StoredPoint

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)
# The keys of GPU and host samples (rankboard.gpu), logged at step = unix seconds: "gpu/", "sys/".
CLOCK_STEPPED = (wire.GPU_KEY.partition("{")[0], wire.SYS_KEY.partition("{")[0])


class IngestCounters:
    """Batches and points taken since this server process started (kept in memory: they restart from 0 with it, as
    Prometheus counters may), for /metrics."""

    def __init__(self) -> None:
        self.batches = self.accepted = self.stored = 0
        self._lock = threading.Lock()  # ingest runs in the thread pool: += is not atomic across threads

    def add(self, result: IngestResult) -> None:
        with self._lock:
            self.batches += 1
            self.accepted += result.accepted
            self.stored += result.stored


@dataclass(frozen=True)
class Post:
    """One batch as posted: for which run, with which token."""

    run_id: int
    token: str
    batch: BatchIn


# What a post gets: its result, or the error its request answers with.
Outcome = IngestResult | Exception


def ingest(
    db: Session,
    *,
    run_id: int,
    token: str,
    batch: BatchIn,
    counters: IngestCounters | None = None,
    series: SeriesIds | None = None,
) -> IngestResult:
    """Stores a batch in one transaction; points already stored (a retry, a replayed spool) are skipped."""
    (outcome,) = ingest_group(db, [Post(run_id, token, batch)], counters=counters, series=series)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def ingest_group(
    db: Session, posts: Sequence[Post], *, counters: IngestCounters | None = None, series: SeriesIds | None = None
) -> list[Outcome]:
    """Stores the posts in one transaction: a post refused (an unknown run, a wrong token, a run that ended) gets
    its error before it writes anything, and the others are stored all the same. The live log, the chart tiers and
    the summaries of the series they touched are written once for all of them, at the end.

    Should the transaction fail (a post the database refuses), each post is stored again on its own: one post's
    failure never costs the others theirs. No savepoint per post: with one, each post flushed the ORM and talked to
    the database twice more, for a failure that does not come. `series` keeps the series ids between groups
    (app.workers.ingest_writer).
    """
    group = _Group(db, series)
    try:
        with db.begin():
            outcomes = group.take(posts)
    except SQLAlchemyError:
        for post in posts:
            if series is not None:
                series.forget(post.run_id)  # a series may have gone with its run
        if len(posts) == 1:
            raise
        log.warning("a group of %s batches failed as a whole: each is stored on its own", len(posts), exc_info=True)
        return [_alone(db, post, counters, series) for post in posts]
    if series is not None:  # committed: other writers may use them now
        series.keep(group.new_series)
    if counters is not None:  # counted once committed: a batch refused or rolled back was not taken
        for outcome in outcomes:
            if isinstance(outcome, IngestResult):
                counters.add(outcome)
    return outcomes


def _alone(db: Session, post: Post, counters: IngestCounters | None, series: SeriesIds | None) -> Outcome:
    try:
        return ingest_group(db, [post], counters=counters, series=series)[0]
    except Exception as error:  # the post's own request answers with it
        return error


class _Taken(NamedTuple):
    """A post admitted, its run, and its points as a column per (series id, rank)."""

    post: Post
    run: Run
    columns: dict[tuple[int, int], chunks.Column]


class _Group:
    """One transaction's posts: each run read once (its status too: a run that ended since the last group takes no
    more), each (run, token) checked once, and the chunks written kept for the refresh at the end."""

    def __init__(self, db: Session, series: SeriesIds | None) -> None:
        self.db, self.series = db, series
        self.runs: dict[int, Run] = {}
        self.tokens: dict[tuple[int, str], bool] = {}
        self.written: dict[int, list[chunks.Written]] = {}  # by run
        self.beats: dict[tuple[int, int], tuple[str, int]] = {}  # (run, rank): (host, step), the last said
        self.new_series: SeriesKeys = {}  # found or made by this transaction: kept once it commits

    def take(self, posts: Sequence[Post]) -> list[Outcome]:
        metric_store.hold_writes(self.db)  # before any read, which would begin a read transaction on SQLite
        # Before any read too, on PostgreSQL: the runs are then read as the last writer of each left them.
        metric_store.lock_runs(self.db, {post.run_id for post in posts})
        with self.db.no_autoflush:  # each post's progress moves its run: the run's row is written once, at the commit
            outcomes = self._all(posts)
        rank_store.upsert_heartbeats(self.db, self.beats, at=utcnow())  # one statement, not one a post
        written = {run_id: chunks.combined(run_written) for run_id, run_written in self.written.items()}
        _refresh(self.db, [chunk for run_written in written.values() for chunk in run_written])
        metric_store.log_recent(self.db, written)  # last: on PostgreSQL its lock is then held only to the commit
        return outcomes

    def _all(self, posts: Sequence[Post]) -> list[Outcome]:
        """Each post admitted and its columns made; then all their points written at once (`_write`); then what
        each says of its run, in order. (What one says cannot refuse the next: a run that ended on a process's word
        still takes batches a while, app.launcher.external.)"""
        taken: list[_Taken | RankboardError] = []
        for post in posts:
            try:
                run = self._admitted(post)
            except RankboardError as error:  # refused before it wrote anything
                taken.append(error)
                continue
            if kind(run.launcher).joins:  # its processes say themselves that they live, and how they ended
                external.took_batch(self.db, run)
            taken.append(_Taken(post, run, _columns(post.batch, self._ids(run, post.batch, self.new_series))))
        stored = iter(self._write([one for one in taken if isinstance(one, _Taken)]))
        return [self._said(one, next(stored)) if isinstance(one, _Taken) else one for one in taken]

    def _write(self, taken: Sequence[_Taken]) -> list[int]:
        """The posts' points, written a round at a time, each round as many posts as share no (series, rank) (as a
        retry would with the batch it repeats), in order; each post's new points. One write for a group's posts, not
        one each: its reads, its statement and its numpy calls are paid once (on PostgreSQL, round trips)."""
        stored, left = [0] * len(taken), list(range(len(taken)))
        while left:
            claimed: dict[tuple[int, int], int] = {}  # (series, rank): the post whose column it is in this round
            later = []
            for i in left:
                if claimed.keys() & taken[i].columns.keys():
                    later.append(i)
                else:
                    claimed |= dict.fromkeys(taken[i].columns, i)
            columns = {key: taken[i].columns[key] for key, i in claimed.items()}
            written = metric_store.insert_points(self.db, columns, log=False, locked=True, append=True)  # lock_runs
            for chunk in written:
                i = claimed[chunk.series_id, chunk.rank]
                stored[i] += len(chunk.new.steps)
                self.written.setdefault(taken[i].run.id, []).append(chunk)
            left = later
        return stored

    def _said(self, taken: _Taken, stored: int) -> IngestResult:
        """What the post says of its run (its nodes, progress and endings) taken, and its answer."""
        run, batch, joins = taken.run, taken.post.batch, kind(taken.run.launcher).joins
        if batch.node is not None:
            nodes.record(self.db, run=run, node=batch.node)
        self.beats |= {(run.id, beat.rank): (beat.host, beat.step) for beat in batch.all_heartbeats}
        _apply_progress(self.db, run, batch)
        for ending in batch.all_endings if joins else ():
            external.ended(self.db, run, ending)
        stop = joins and run.stop_requested_at is not None
        dump = dump_requests.pending(run, now=utcnow())
        return IngestResult(accepted=batch.size, stored=stored, stop=stop, dump=dump)

    def _admitted(self, post: Post) -> Run:
        """The post's run, once its token fits and it takes batches; raises why not."""
        run = self.runs.get(post.run_id) or metric_store.ingest_run(self.db, post.run_id)
        if run is None:
            raise RunNotFound(post.run_id)
        self.runs[post.run_id] = run
        fits = self.tokens.get((run.id, post.token))
        if fits is None:
            fits = self.tokens[(run.id, post.token)] = token_fits(self.db, run, post.token)
        if not fits:
            raise InvalidToken(f"the token is not the one run {run.id} was launched with")
        if not kind(run.launcher).takes_batch(run, now=utcnow()):
            raise RunNotActive(f"run {run.id} is {run.status.value}: it takes no more metrics")
        return run

    def _ids(self, run: Run, batch: BatchIn, new: MutableMapping[tuple[int, object, str], int]) -> dict[str, int]:
        keys = _keys(batch)
        if self.series is None or run.deleting_at is not None:
            return metric_store.series_ids(self.db, run_id=run.id, keys=keys)
        return self.series.of(self.db, run_id=run.id, made=run.created_at, keys=keys, new=new)


def _apply_progress(db: Session, run: Run, batch: BatchIn) -> None:
    """The run's progress and heartbeat from the batch; a queued or starting run that reports is running."""
    if advance_progress(run, batch):
        run.heartbeat_at = utcnow()
        if run.status in (RunStatus.queued, RunStatus.starting):
            what = "progress" if batch.progress is not None else "step"
            transitions.move(db, run, RunStatus.running, f"the trainer reported its first {what}")


def token_fits(db: Session, run: Run, token: str) -> bool:
    """The token the run was launched with, or one a process of a run launched elsewhere got when it joined."""
    token_hash = sha256(token)
    if run.token_hash is not None and hmac.compare_digest(run.token_hash, token_hash):
        return True
    return kind(run.launcher).joins and run_store.has_process_token(db, run_id=run.id, token_hash=token_hash)


def advance_progress(run: Run, batch: BatchIn) -> bool:
    """Moves the run's progress on to what the batch says, never back; True if it said anything of training.

    A batch's progress says where training stands; without one (a script that only logs), the highest step of its
    training points does. GPU and host samples are at step = unix seconds, so they are no training step.
    """
    progress = batch.progress
    if progress is not None and progress.step >= run.step:  # an older batch resent, or redone steps after a restart
        run.epoch, run.step = progress.epoch, progress.step
        # 0 says "no total": a script's progress without one keeps what it declared (report.init, or its join).
        run.total_steps = progress.total_steps or run.total_steps
        if progress.samples_per_s:  # a report without a rate (an older trainer's final one) keeps the last measured
            run.samples_per_s = progress.samples_per_s
    tops = [point.step for point in batch.points if not point.key.startswith(CLOCK_STEPPED)]
    tops += [max(c.steps) for c in batch.columns if c.steps and not c.key.startswith(CLOCK_STEPPED)]
    top = max(tops, default=None)
    if top is not None:
        run.step = max(run.step, top)
    return progress is not None or top is not None


def _keys(batch: BatchIn) -> set[str]:
    return {p.key for p in batch.points} | {column.key for column in batch.columns}


def _columns(batch: BatchIn, ids: dict[str, int]) -> dict[tuple[int, int], chunks.Column]:
    """The batch's points as one column per (series id, rank)."""
    grouped: dict[tuple[int, int], tuple[list[int], list[float], list[float]]] = {}
    for p in batch.points:
        steps, values, times = grouped.setdefault((ids[p.key], p.rank), ([], [], []))
        steps.append(p.step)
        values.append(p.value)
        times.append(p.time)
    for column in batch.columns:
        steps, values, times = grouped.setdefault((ids[column.key], column.rank), ([], [], []))
        steps += column.steps
        values += column.values
        times += column.times
    return chunks.Column.many(grouped)


def _refresh(db: Session, written: Sequence[chunks.Written]) -> None:
    """The chart tiers and the runs table's summaries of the chunks written, in the same transaction."""
    if not written:  # a batch of nothing but re-sent points cannot change the charts' tiers
        return
    chart_store.merge_tiers(db, written)
    summary_store.merge(db, written)


def _store_points(db: Session, *, run_id: int, batch: BatchIn) -> int:
    ids = metric_store.series_ids(db, run_id=run_id, keys=_keys(batch))
    written = metric_store.insert_points(db, _columns(batch, ids), log=False)
    _refresh(db, written)
    metric_store.log_recent(db, {run_id: written})
    return sum(len(chunk.new.steps) for chunk in written)


def ingest_leftover_spools(db: Session, *, run_id: int, run_dir: Path) -> int:
    """Stores what a trainer spooled but never sent (the server was away when it ended), and the progress it
    carried; returns new points.

    Each spool line is one batch exactly as the client would have posted it; a line cut short by a dying process
    is skipped, and so is one the store fails on (the batches a client set aside for that): each goes in a savepoint
    of its own, since this runs inside the transaction that finishes the run, which one bad line must never hold up.
    """
    run = runs.get_run(db, run_id=run_id)
    stored = 0
    for spool in sorted(run_dir.glob(wire.SPOOL_GLOB)):
        for line in spool.read_bytes().splitlines():
            try:
                batch = BatchIn.model_validate_json(line)
                with db.begin_nested():
                    stored += _store_points(db, run_id=run_id, batch=batch)
            except (ValidationError, SQLAlchemyError, ValueError) as error:
                log.warning("run %s: skipped a spooled batch of %s: %s", run_id, spool.name, error)
                continue
            advance_progress(run, batch)
        spool.unlink()
    return stored


def read_series(
    db: Session, *, run_id: int, key: str, start_step: int, start_rank: int, end_step: int | None, limit: int
) -> SeriesOut:
    """A page of one series by (step, rank) from the cursor (start_step, start_rank); `next_step` and `next_rank`
    continue it."""
    runs.get_run(db, run_id=run_id)
    if metric_store.find_series(db, run_id=run_id, key=key) is None:
        raise SeriesNotFound(run_id, key, metric_store.series_keys(db, run_id=run_id))
    points = metric_store.points_in_range(
        db, run_id=run_id, key=key, start_step=start_step, start_rank=start_rank, end_step=end_step, limit=limit + 1
    )
    if len(points) <= limit:
        return SeriesOut(key=key, points=[_out(p) for p in points], next_step=None, next_rank=None)
    following = points[limit]
    # A page ends at a whole step when it can, so a caller paging by step alone never sees one split; only a step
    # with more ranks than `limit` is split, and next_rank says where in it the next page starts.
    whole = [p for p in points[:limit] if p.step < following.step]
    page, next_rank = (whole, 0) if whole else (points[:limit], following.rank)
    return SeriesOut(key=key, points=[_out(p) for p in page], next_step=following.step, next_rank=next_rank)


def _out(point: SeriesPoint) -> PointOut:
    return PointOut(step=point.step, rank=point.rank, value=point.value, time=point.time)


CSV_HEADER = "step,rank,value,time\n"
# Steps read per statement while a CSV streams (1,024 chunks of each rank): memory stays bounded whatever the range.
CSV_STEPS = 1024 * chunks.SPAN


def series_csv(
    sessions: sessionmaker[Session],
    *,
    run_id: int,
    key: str,
    start_step: int,
    start_rank: int,
    end_step: int | None,
    limit: int | None,
) -> Iterator[str]:
    """One series from the cursor (start_step, start_rank) through end_step, every point or the first `limit`, as
    CSV text: `step,rank,value,time` by step then rank, floats as repr writes them (round-trip exact), NaN as NaN.

    An unknown run or key raises here; the points are read as the text is taken, CSV_STEPS at a time, each read in a
    session of its own: a long series streams in bounded memory, and no transaction stays open while a client reads.
    """
    with sessions() as db:
        runs.get_run(db, run_id=run_id)
        series_id = metric_store.find_series(db, run_id=run_id, key=key)
        if series_id is None:
            raise SeriesNotFound(run_id, key, metric_store.series_keys(db, run_id=run_id))
        stored = chunks.step_range(db, series_id=series_id)
    last = -1 if stored is None else stored[1] if end_step is None else min(end_step, stored[1])
    return _csv_text(sessions, series_id=series_id, cursor=(start_step, start_rank), last=last, limit=limit)


def _csv_text(
    sessions: sessionmaker[Session], *, series_id: int, cursor: tuple[int, int], last: int, limit: int | None
) -> Iterator[str]:
    yield CSV_HEADER
    step, left = cursor[0], limit
    while left != 0 and step <= last:
        with sessions() as db:
            first = chunks.read_on_from(db, series_id=series_id, step=step)  # a gap of a million steps is one seek
            if first is None or first > last:
                return
            points = chunks.read(db, series_id=series_id, first=first, last=min(last, first + CSV_STEPS - 1))
        points = points.take((points.steps > cursor[0]) | (points.ranks >= cursor[1]))
        if left is not None:
            points, left = points.take(slice(0, left)), left - min(left, len(points))
        yield _csv_lines(points)
        step = first + CSV_STEPS


def _csv_lines(points: chunks.Points) -> str:
    columns = (points.steps.tolist(), points.ranks.tolist(), _csv_floats(points.values), _csv_floats(points.times))
    return "".join(f"{step},{rank},{value},{time}\n" for step, rank, value, time in zip(*columns, strict=True))


def _csv_floats(values: np.ndarray) -> list[str]:
    """repr's shortest exact digits (inf and -inf as it writes them); NaN spelled as JSON's answers and pandas read."""
    return ["NaN" if value != value else repr(value) for value in values.tolist()]


def series_keys(db: Session, *, run_id: int) -> list[str]:
    runs.get_run(db, run_id=run_id)
    return metric_store.series_keys(db, run_id=run_id)


@dataclass(frozen=True)
class LivePoints:
    """What a live page has not seen yet: the points stored since its cursor, where its next poll starts, and
    whether points after its cursor were dropped from the live log before it read them (it must read its charts
    again then)."""

    points: list[StoredPoint]
    cursor: int
    missed: bool
    others: frozenset[str] = frozenset()  # keys not watched that got points: named, not sent


def new_points(
    db: Session,
    *,
    run_id: int,
    after_id: int,
    limit: int = 5000,
    watch: frozenset[str] | None = None,
    keys: MutableMapping[int, str] | None = None,
) -> LivePoints:
    """Points stored since the cursor `after_id` (of the `watch` keys only, if given). With none, the cursor moves on
    to the log's newest point of any run, so that a page whose run logs nothing while others log millions does not
    fall behind the log. `keys`: the run's series keys by id, kept by the caller between calls (a page's stream)."""
    head = metric_store.last_point_id(db)  # first: every point numbered up to it is committed (see there)
    points, others = metric_store.watched_points_after(
        db, run_id=run_id, after_id=after_id, limit=limit, watch=watch, keys=keys
    )
    missed = after_id + 1 < metric_store.first_kept_id(db)  # after the points: a drop meanwhile is seen
    return LivePoints(points, points[-1].id if points else max(after_id, head), missed, frozenset(others))
