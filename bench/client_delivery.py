"""What the metrics client costs and delivers, against a real server on SQLite.

    .venv/bin/python -m bench.client_delivery [--points 100000] [--repeats 5] [--max-batch 10000]

1. log(): median nanoseconds per call of one metric, the thread running (it competes for the GIL).
2. Delivery: 100,000 points logged as fast as a loop can, then close(): how long close() takes to drain what is
   still queued, and points/s from the first log() to the last point stored.
3. The reporting thread's CPU while a loop logs 2,000 points/s for 10 s (its own CPU time, from /proc, as a share of
   one core).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import psutil
from rankboard.report import Reporter
from sqlalchemy import func, select

from app.core.db import make_engine
from app.core.models import MetricChunk, MetricSeries
from tests.live import LiveServer, open_run

TOKEN = "bench-token"


def log_ns(reporter: Reporter, calls: int = 200_000) -> float:
    start = time.perf_counter_ns()
    for step in range(calls):
        reporter.log({"loss": 0.5}, step=step)
    return (time.perf_counter_ns() - start) / calls


def stored_points(server: LiveServer, run_id: int) -> int:
    engine = make_engine(f"sqlite:///{server.root / 'data' / 'rankboard.db'}")
    with engine.connect() as connection:
        count = connection.scalar(
            select(func.sum(MetricChunk.n)).join(MetricSeries).where(MetricSeries.run_id == run_id)
        )
    engine.dispose()
    return int(count or 0)


def delivery(server: LiveServer, spool: Path, points: int, max_batch: int) -> tuple[float, float, float]:
    """(median ns per log call, seconds close() took, points/s from the first log to the last stored)."""
    run_id = open_run(server, TOKEN)
    reporter = Reporter(server.url, str(run_id), TOKEN, spool, max_batch=max_batch)
    start = time.perf_counter()
    per_call = log_ns(reporter, points)
    closing = time.perf_counter()
    reporter.close(timeout=60)
    end = time.perf_counter()
    assert stored_points(server, run_id) == points, "points were lost or doubled"
    return per_call, end - closing, points / (end - start)


def thread_cpu_share(server: LiveServer, spool: Path, rate: int, seconds: float, max_batch: int) -> float:
    """The reporting thread's CPU time over `seconds` of logging `rate` points/s, as a share of one core."""
    run_id = open_run(server, TOKEN)
    reporter = Reporter(server.url, str(run_id), TOKEN, spool, max_batch=max_batch)
    native = reporter._thread.native_id  # the thread whose CPU is measured
    process = psutil.Process()

    def cpu() -> float:
        return next(t.user_time + t.system_time for t in process.threads() if t.id == native)

    before, step, start = cpu(), 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        while step < elapsed * rate:  # 2,000 points/s, logged 20 at a time every 10 ms like a fast training loop
            reporter.log({"loss": 0.5}, step=step)
            step += 1
        time.sleep(0.01)
    share = (cpu() - before) / (time.perf_counter() - start)
    reporter.close()
    return share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-batch", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        server = LiveServer(Path(root), RANKBOARD_SUPERVISE_INTERVAL_S="3600")
        server.start()
        try:
            spools = [Path(root) / f"spool{i}" for i in range(args.repeats)]
            runs = [delivery(server, spool, args.points, args.max_batch) for spool in spools]
            shares = [thread_cpu_share(server, Path(root) / f"s{i}", 2000, 10, args.max_batch) for i in range(3)]
        finally:
            server.stop()
    calls, drains, rates = zip(*runs, strict=True)
    print(f"max_batch {args.max_batch}, {args.points:,} points, {args.repeats} runs (medians):")
    print(f"  log() of one metric, thread running: {statistics.median(calls):,.0f} ns per call")
    print(f"  close() drained the rest in {statistics.median(drains):.3f} s (runs: "
          f"{', '.join(f'{d:.3f}' for d in drains)})")  # fmt: skip
    print(f"  delivered {statistics.median(rates):,.0f} points/s from the first log() to the last stored")
    print(f"  reporting thread at 2,000 points/s: {100 * statistics.median(shares):.2f}% of a core "
          f"(runs: {', '.join(f'{100 * s:.2f}%' for s in shares)})")  # fmt: skip


if __name__ == "__main__":
    main()
