"""What the log panel costs on a huge log: the tail of a 1 GiB file, filtered and not, and one live poll.

    .venv/bin/python bench/logs_tail.py [--repeats 20]

The file is a sparse gigabyte followed by 100,000 real lines (a warning every 100th), so it takes no disk. Prints
the median milliseconds and the bytes each call read (from /proc/self/io), for: the last 200 lines; the last 200
lines matching a filter that is common; one that never matches (the scan stops at its budget); one live read.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.services import logs

GIB = 1024**3


def bytes_read() -> int:
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"])


def measure(name: str, call: Callable[[], object], repeats: int) -> None:
    times, cost = [], 0
    for _ in range(repeats):
        before, started = bytes_read(), time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
        cost = bytes_read() - before
    print(f"{name:<40} median {statistics.median(times):8.2f} ms   read {cost / 1024:10.0f} KiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "stdout.log"
        with open(path, "wb") as f:
            f.truncate(GIB)
            f.seek(GIB)
            f.write(b"".join(
                (b"WARNING: slow step %d\n" if i % 100 == 0 else b"[rank 0] step %d loss 0.5\n") % i
                for i in range(100_000)
            ))  # fmt: skip
        size = path.stat().st_size
        measure("tail 200 lines", lambda: logs.tail(path, 200), args.repeats)
        measure("tail 200 lines matching 'warning'", lambda: logs.tail(path, 200, "warning"), args.repeats)
        measure("tail, filter never matches (8 MiB)", lambda: logs.tail(path, 200, "no such text"), args.repeats)
        measure("live poll, 256 KiB behind", lambda: logs.read_from(path, size - logs.READ_LIMIT), args.repeats)


if __name__ == "__main__":
    main()
