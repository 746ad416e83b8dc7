"""The threads that store trainers' batches: each takes every batch queued meanwhile and stores them in one transaction.

Eight threads each storing its own batch queued on SQLite's one write lock, whose busy handler sleeps in steps of up
to 100 ms: a lock convoy, which held the p99 of a post near a second with a core still free (bench/big_job.py). One
writer never waits for another, and one commit carries many batches; each batch still has its own answer
(app.services.metrics.ingest_group). PostgreSQL locks rows, not the database: a few writers there, each with its own
runs' posts, grouping in the same way. The batches are parsed before they come here, on the ingest threads.

A group's own cost (its transaction, its lookups, its commit) was about a fifth of a one-post group's: when several
senders post at once (a job's nodes, each on its connection), a group waits up to LINGER_S (by database) for the posts
of those that posted within RECENT_S (bench/big_job.py). A sender posting alone, one post after the other, never waits.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Hashable
from concurrent.futures import Future
from typing import NamedTuple

from sqlalchemy.orm import Session, sessionmaker

from app.schemas.metrics import IngestResult
from app.services import metrics
from app.services.metrics import IngestCounters, Post
from app.store.metrics import SeriesIds
from app.workers.ingest_threads import lower_this_thread

GROUP = 256  # batches in one transaction at most: a commit's latency stays bounded when a backlog drains
WRITERS = {"sqlite": 1, "postgresql": 4}
# How long after its first post a group waits for other senders' posts. Longer on PostgreSQL, where a group's own
# statements cost more: at 128x8 with 2 workers, 50 ms took the server from 0.57 to 0.49 of a core (p99 55 -> 90
# ms); on SQLite it saved nothing measurable (0.45 either way, bench/big_job.py).
LINGER_S = {"sqlite": 0.02, "postgresql": 0.05}
RECENT_S = 0.1  # the senders that posted within this long are those a group waits for


class _Job(NamedTuple):
    post: Post
    done: Future[IngestResult]
    sender: Hashable | None  # the connection it came on; None: not known
    arrived: float  # time.monotonic()


class _Senders:
    """The senders that posted within the last RECENT_S: those a group waits for. Noted by the ingest threads, read
    by the writers. A sender gone quiet (its job ended, its connection closed) is waited for no longer than that."""

    def __init__(self) -> None:
        self._recent: collections.deque[tuple[float, Hashable]] = collections.deque()
        self._lock = threading.Lock()

    def saw(self, sender: Hashable, at: float) -> None:
        with self._lock:
            self._recent.append((at, sender))

    def recent(self, now: float) -> set[Hashable]:
        with self._lock:
            while self._recent and now - self._recent[0][0] > RECENT_S:
                self._recent.popleft()
            return {sender for _, sender in self._recent}


class _Lane:
    """One writer thread's posts: a queue, and the senders lately seen on it; a group waits up to `linger` seconds."""

    def __init__(self, linger: float) -> None:
        self.queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.senders = _Senders()
        self.linger = linger

    def gathered(self, first: _Job) -> list[_Job]:
        """`first` and the posts queued since; and until every sender that posted lately has one in the group, those
        that come within `linger` of `first`."""
        group, deadline = [first], first.arrived + self.linger
        waiting = self.senders.recent(first.arrived) - {first.sender}
        while len(group) < GROUP:
            wait = deadline - time.monotonic() if waiting else 0.0
            try:
                job = self.queue.get(timeout=wait) if wait > 0 else self.queue.get_nowait()
            except queue.Empty:
                break
            if job is None:  # closing: the group is stored, then its thread ends
                self.queue.put(None)
                break
            group.append(job)
            waiting.discard(job.sender)
        return group


class IngestWriter:
    """Writer threads at a niceness of their own (RANKBOARD_INGEST_NICE, as app.workers.ingest_threads), sharing one
    cache of series ids. Each has a lane of its own, and a run's posts all take one lane: on PostgreSQL a writer
    holds a run until its commit (app.store.metrics.lock_runs), and four writers sharing the posts of one big job
    each waited on the others' holds, with groups a quarter the size (bench/big_job.py)."""

    def __init__(self, sessions: sessionmaker[Session], *, nice: int, counters: IngestCounters | None = None) -> None:
        self.nice, self._sessions, self._counters = nice, sessions, counters
        self.series = SeriesIds()
        self._lanes: list[_Lane] = []
        self._threads: list[threading.Thread] = []
        self._starting = threading.Lock()

    def _start(self) -> None:
        """The threads, on the first batch: an app that never takes one (most tests' apps) starts none."""
        with self._starting:
            if self._threads:
                return
            dialect = self._sessions.kw["bind"].dialect.name
            self._lanes = [_Lane(LINGER_S.get(dialect, LINGER_S["sqlite"])) for _ in range(WRITERS.get(dialect, 1))]
            self._threads = [
                threading.Thread(target=self._run, args=(lane,), name=f"rankboard-ingest-writer-{n}", daemon=True)
                for n, lane in enumerate(self._lanes)
            ]
            for thread in self._threads:
                thread.start()

    def submit(self, post: Post, sender: Hashable | None = None) -> Future[IngestResult]:
        """Queues the post; the future holds its result (or its error) once its group has committed. From any
        thread: the ingest thread that parsed it queues it, so the writer starts while the event loop wakes.
        `sender` names where it came from (the client's address and port), for the groups' wait."""
        if not self._threads:
            self._start()
        done: Future[IngestResult] = Future()
        now, lane = time.monotonic(), self._lanes[post.run_id % len(self._lanes)]
        if sender is not None:
            lane.senders.saw(sender, now)
        lane.queue.put(_Job(post, done, sender, now))
        return done

    def close(self) -> None:
        """Stores what is queued, then ends the threads."""
        with self._starting:
            self._threads, threads = [], self._threads
        for lane in self._lanes:
            lane.queue.put(None)
        for thread in threads:
            thread.join()

    def _run(self, lane: _Lane) -> None:
        lower_this_thread(self.nice)
        while (first := lane.queue.get()) is not None:
            self._store(lane.gathered(first))

    def _store(self, group: list[_Job]) -> None:
        try:
            with self._sessions() as db:
                outcomes = metrics.ingest_group(db, [job.post for job in group], counters=self._counters,
                                                series=self.series)  # fmt: skip
        except Exception as error:  # each request answers with it (a 500); the writer lives on
            outcomes = [error] * len(group)
        for job, outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, Exception):
                job.done.set_exception(outcome)
            else:
                job.done.set_result(outcome)
