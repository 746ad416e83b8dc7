"""The threads that store trainers' batches: each takes every batch queued meanwhile and stores them in one transaction.

Eight threads each storing its own batch queued on SQLite's one write lock, whose busy handler sleeps in steps of up
to 100 ms: a lock convoy, which held the p99 of a post near a second with a core still free (bench/big_job.py). One
writer never waits for another, and one commit carries many batches; each batch still has its own answer
(app.services.metrics.ingest_group). PostgreSQL locks rows, not the database: a few writers there, each grouping in
the same way. The batches are parsed before they come here, on the ingest threads.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from concurrent.futures import Future

from sqlalchemy.orm import Session, sessionmaker

from app.schemas.metrics import IngestResult
from app.services import metrics
from app.services.metrics import IngestCounters, Post
from app.store.metrics import SeriesIds
from app.workers.ingest_threads import lower_this_thread

GROUP = 256  # batches in one transaction at most: a commit's latency stays bounded when a backlog drains
WRITERS = {"sqlite": 1, "postgresql": 4}

_Job = tuple[Post, "Future[IngestResult]"]


class IngestWriter:
    """Writer threads at a niceness of their own (RANKBOARD_INGEST_NICE, as app.workers.ingest_threads), sharing one
    queue of posts and one cache of series ids."""

    def __init__(self, sessions: sessionmaker[Session], *, nice: int, counters: IngestCounters | None = None) -> None:
        self.nice, self._sessions, self._counters = nice, sessions, counters
        self.series = SeriesIds()
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._starting = threading.Lock()

    def _start(self) -> None:
        """The threads, on the first batch: an app that never takes one (most tests' apps) starts none."""
        with self._starting:
            if self._threads:
                return
            dialect = self._sessions.kw["bind"].dialect.name
            self._threads = [
                threading.Thread(target=self._run, name=f"rankboard-ingest-writer-{n}", daemon=True)
                for n in range(WRITERS.get(dialect, 1))
            ]
            for thread in self._threads:
                thread.start()

    def submit(self, post: Post) -> Future[IngestResult]:
        """Queues the post; the future holds its result (or its error) once its group has committed. From any
        thread: the ingest thread that parsed it queues it, so the writer starts while the event loop wakes."""
        if not self._threads:
            self._start()
        done: Future[IngestResult] = Future()
        self._queue.put((post, done))
        return done

    def close(self) -> None:
        """Stores what is queued, then ends the threads."""
        with self._starting:
            self._threads, threads = [], self._threads
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            thread.join()

    def _run(self) -> None:
        lower_this_thread(self.nice)
        while (first := self._queue.get()) is not None:
            group = [first]
            with contextlib.suppress(queue.Empty):
                while len(group) < GROUP:
                    job = self._queue.get_nowait()
                    if job is None:  # closing: the other threads take their own
                        self._queue.put(None)
                        break
                    group.append(job)
            self._store(group)

    def _store(self, group: list[_Job]) -> None:
        try:
            with self._sessions() as db:
                outcomes = metrics.ingest_group(db, [post for post, _ in group], counters=self._counters,
                                                series=self.series)  # fmt: skip
        except Exception as error:  # each request answers with it (a 500); the writer lives on
            outcomes = [error] * len(group)
        for (_post, done), outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, Exception):
                done.set_exception(outcome)
            else:
                done.set_result(outcome)
