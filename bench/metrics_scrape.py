"""Time of one `GET /metrics` with 100 live runs, each with a loss series and the samples of 8 GPUs.

.venv/bin/python -m bench.metrics_scrape [--runs 100] [--gpus 8] [--scrapes 30]

Each run is fed through the real ingest endpoint: 500 loss steps and 120 samples (two minutes at 1 s) of each GPU
field the trainer sends. The supervisor is told to sleep, so the runs stay as they are set: running, reported to by
this process.

Last measured (this 2-core machine, shared, 2026-11-27; 5 runs of 40 scrapes each, interleaved): prometheus_client
writing the exposition, a median of 41.6 ms (run medians 41.1 to 81.6 ms, the two slowest while the machine was
busy; fastest scrapes 40.1 to 41.4), against 34.7 ms (33.8 to 36.1; fastest 32.7 to 33.5) for the text format
written by hand before: about 7 ms more for its 2,336 lines, in building a sample object per line and checking
and escaping each label. At a 15 s scrape interval that is 0.05% of a core.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rankboard import wire

from tests.live import LiveServer, open_run

NOW = 1_790_000_000
TOKEN = "bench-token"


def feed(server: LiveServer, run_id: int, gpus: int) -> None:
    points = [wire.Point("loss", step, 1.0 / step, 0, NOW + step) for step in range(1, 501)]
    for at in range(NOW, NOW + 120):
        for index in range(gpus):
            for field, value in (("util", 90.0), ("mem_used", 6e10), ("mem_total", 8e10), ("power", 600.0),
                                 ("power_limit", 700.0), ("temp", 60.0)):  # fmt: skip
                key = wire.GPU_KEY.format(host=f"node-{run_id % 16}", index=index, field=field)
                points.append(wire.Point(key, at, value, 0, at))
    progress = wire.Progress(epoch=1, epochs=1, step=500, total_steps=1000, samples_per_s=512.0)
    with server.api() as api:
        answer = api.post(f"/api/runs/{run_id}/metrics", json=wire.Batch(tuple(points), progress=progress).to_json(),
                          headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        answer.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        server = LiveServer(Path(root), RANKBOARD_PROMETHEUS="true", RANKBOARD_SUPERVISE_INTERVAL_S="3600")
        server.start()
        try:
            for _ in range(args.runs):
                feed(server, open_run(server, TOKEN), args.gpus)
            timings, size = [], 0
            with server.api() as api:
                for _ in range(args.scrapes):
                    start = time.perf_counter()
                    answer = api.get("/metrics")
                    timings.append(time.perf_counter() - start)
                    size = len(answer.content)
                    answer.raise_for_status()
        finally:
            server.stop()
    lines = answer.text.count("\n")
    print(f"GET /metrics, {args.runs} live runs x {args.gpus} GPUs ({lines} lines, {size / 1024:.0f} KiB): "
          f"median {statistics.median(timings) * 1000:.1f} ms, min {min(timings) * 1000:.1f}, "
          f"max {max(timings) * 1000:.1f} over {args.scrapes} scrapes")  # fmt: skip


if __name__ == "__main__":
    main()
