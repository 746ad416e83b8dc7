"""Export speed and the server's memory while it streams: `GET /api/export` (a zip of runs and points, Parquet or
CSV) of a run of 10 M points and of one of 1 M, from a live server (SQLite), each download read to its end.

    .venv/bin/python -m bench.export [--points 10000000] [--repeats 3]

Memory is the server process's resident set (psutil), sampled every 20 ms during each download: its peak over what
it held before. Bounded memory shows as the same peak for 1 M points as for 10 M.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psutil
from rankboard import wire

from tests.live import LiveServer, open_run, serving

TOKEN = "bench-token"
KEYS = ("loss", "lr", "acc", "grad_norm")
RANKS = 2


def fill(server: LiveServer, points: int) -> int:
    """A run with `points` points: KEYS on RANKS ranks, posted in batches of the largest size."""
    run_id = open_run(server, TOKEN)
    connection = http.client.HTTPConnection("127.0.0.1", server.port)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    per_step = len(KEYS) * RANKS
    steps_per_batch = wire.MAX_POINTS_PER_BATCH // per_step
    for first in range(0, points // per_step, steps_per_batch):
        steps = list(range(first, min(first + steps_per_batch, points // per_step)))
        times = [1.7e9 + step * 0.1 for step in steps]
        columns = [wire.Column(key, rank, steps, [1.0 / (step + 1 + rank) for step in steps], times)
                   for key in KEYS for rank in range(RANKS)]  # fmt: skip
        connection.request("POST", wire.INGEST_PATH.format(run_id=run_id),
                           json.dumps(wire.Batch(columns=tuple(columns)).to_json()), headers)  # fmt: skip
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
    connection.close()
    return run_id


def download(server: LiveServer, run_id: int, output: str) -> tuple[float, int, int]:
    """Seconds, bytes, and the server's peak resident memory over its start (bytes) while it streamed."""
    process = psutil.Process(server.process.pid)  # type: ignore[union-attr]
    before, peak, done = process.memory_info().rss, [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    start = time.perf_counter()
    connection.request("GET", f"/api/export?run={run_id}&format={output}")
    response = connection.getresponse()
    size = sum(len(chunk) for chunk in iter(lambda: response.read(1 << 20), b""))
    seconds = time.perf_counter() - start
    done.set()
    watcher.join()
    assert response.status == 200
    return seconds, size, max(peak[0] - before, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, serving(Path(scratch)) as server:
        start = time.perf_counter()
        runs = {points: fill(server, points) for points in (args.points // 10, args.points)}
        print(f"filled {sum(runs):,} points in {time.perf_counter() - start:.0f} s")
        for points, run_id in runs.items():
            for output in ("parquet", "csv"):
                results = [download(server, run_id, output) for _ in range(args.repeats)]
                seconds = [r[0] for r in results]
                rate = points / statistics.median(seconds)
                peak = statistics.median(r[2] for r in results) / 2**20
                print(f"{points:>11,} points {output:<8} {rate:>10,.0f} points/s (median of {args.repeats}: "
                      f"{statistics.median(seconds):.1f} s, {min(seconds):.1f}..{max(seconds):.1f}), "
                      f"{results[0][1] / 2**20:,.0f} MiB, server memory +{peak:,.0f} MiB at peak")  # fmt: skip


if __name__ == "__main__":
    main()
