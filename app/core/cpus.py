"""The server's own CPUs (RANKBOARD_SERVER_CPUS): on a node that trains too, its threads keep to these, and the runs
it starts still get every CPU it was started with.

Why: on an H100 node's CPU cores (bench/trainer_speed.py --server-cpus, 2026-11-26), a 1-rank run's step took 3.14
ms while the server was taking one of its posts, against 2.53 ms otherwise, with the server on the run's cores; with
the server on two cores of its own, 2.52 against 2.50 ms. Niceness does not do this (RANKBOARD_INGEST_NICE=19: 3.23
against 2.64 ms): those four cores were not full, so there was nothing for training to be given first.

Linux only: a CPU mask belongs to a thread, and a thread or process takes its mask from the thread that starts it.
So `keep_to` sets every thread's mask before the server starts more, and a launcher starts each run inside
`everywhere`, from a thread that has the run's mask for the moment.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import psutil


def parse(text: str) -> frozenset[int]:
    """A CPU list as taskset and /proc write it: "3", "0-3", "0-1,6"; ValueError naming what is wrong."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part.strip()!r} is not a CPU number or range (write it as taskset does: 0-3,6)")
        if dash and int(last) < int(first):
            raise ValueError(f"{part.strip()!r} runs backwards")
        cpus.update(range(int(first), int(last if dash else first) + 1))
    return frozenset(cpus)


def available() -> frozenset[int]:
    """The CPUs this thread may run on; ValueError where the platform does not say (not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        raise ValueError("keeping the server to some CPUs needs Linux")
    return frozenset(os.sched_getaffinity(0))


def keep_to(cpus: frozenset[int]) -> None:
    """Keep this process's every thread, and whatever they start later, to `cpus`."""
    # By thread id: psutil's cpu_affinity, like sched_setaffinity(pid), sets the main thread's mask alone.
    for thread in psutil.Process().threads():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(thread.id, cpus)


@contextlib.contextmanager
def everywhere(cpus: frozenset[int] | None) -> Iterator[None]:
    """This thread on `cpus` meanwhile (None: as it is), so that a process it starts inside begins with them."""
    if cpus is None:
        yield
        return
    own = available()
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, own)


def describe(cpus: frozenset[int]) -> str:
    """`cpus` as taskset lists them: "0-3,6"."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and ranges[-1][1] == cpu - 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
