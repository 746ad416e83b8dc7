"""The threads that parse trainers' batches, at a niceness of their own (RANKBOARD_INGEST_NICE); the ingest writer
(app.workers.ingest_writer) stores them, at the same niceness.

Where the dashboard shares a node with training, its ingest competes with the trainer for the CPU. On Linux niceness
belongs to a thread, so these threads can yield to training while the pages' threads keep theirs; and the supervisor's
thread, which starts the runs, is not one of them, so no run inherits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

WORKERS = 8  # parsing only: a batch of 10,000 points takes a few ms, and posts come from many nodes at once


class IngestThreads:
    def __init__(self, nice: int) -> None:
        self.nice = nice
        self._executor = ThreadPoolExecutor(
            WORKERS, thread_name_prefix="rankboard-ingest", initializer=lower_this_thread, initargs=(nice,)
        )

    async def run(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def lower_this_thread(nice: int) -> None:
    """Lowers the calling thread's priority by `nice` (RANKBOARD_INGEST_NICE); the other threads keep theirs."""
    # Not on Linux a thread id is no process id: the batches are taken all the same, at the server's niceness.
    with contextlib.suppress(OSError):
        if nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)  # Linux: this thread alone
