"""Chart latency on a 1,000,000-point series (one rank) in SQLite, and what keeping its tiers costs ingest.

    .venv/bin/python -m bench.chart [--points 1000000] [--repeats 20]

Builds the series in a temporary database through the store (app.store.metrics.insert_points, no HTTP) in batches
of 1,000 points, one transaction each, as ingest does; a second series of the same size gets the same batches
without tiers, interleaved, so both batch timings see the same database size. Then times GET
/api/runs/{id}/chart through FastAPI's TestClient (so routing, validation and JSON are included, not a socket) at
width 1000: the whole range and a 1% zoom. For comparison it also times the plain GROUP BY over the raw points
that the tiers replace (the store's query with no tier).

Last measured (this 2-core machine while other work ran torchrun tests on it, load ~2.5): whole range 16.8 ms, 1% zoom
19.5 ms, width 4000 over the whole range 81.1 ms; the plain GROUP BY the tiers replace 847 ms (580-960 over runs);
ingest per 1,000-point batch 0.76 ms through the store without tiers, 1.86 ms with them. (Over HTTP, bench.ingest's
medians of seven alternated runs: about 97,000 points/s without tiers, 72,000 with them; noisy on a busy machine.
Through TestClient, alternating batch by batch: 11.5 ms per 1,000-point batch without tiers, 12.6 ms with them.)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.core.models import Run, RunStatus
from app.core.settings import Settings
from app.main import create_app
from app.store import charts as chart_store
from app.store import chunks
from app.store import metrics as metric_store

BATCH = 1000


def median_ms(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def build_series(sessions: sessionmaker[Session], points: int) -> tuple[int, int, list[float], list[float]]:
    """A finished run with `loss` (tiers kept) and `loss_plain` (no tiers); the seconds each batch took, per series."""
    rng = random.Random(0)
    with sessions() as db, db.begin():
        run = Run(name="bench", status=RunStatus.succeeded, workload="mlp", nproc_per_node=1, epochs=1,
                  batch_size=1, lr=0.1, checkpoint_every=1, seed=0)  # fmt: skip
        db.add(run)
        db.flush()
        ids = metric_store.series_ids(db, run_id=run.id, keys=["loss", "loss_plain"])
    with_tiers: list[float] = []
    without: list[float] = []
    for first in range(0, points, BATCH):
        values = [1.0 / (step + 1) + rng.random() * 1e-3 for step in range(first, first + BATCH)]
        for key, times in (("loss", with_tiers), ("loss_plain", without)):
            column = chunks.Column.of(range(first, first + BATCH), values, [0.0] * BATCH)
            start = time.perf_counter()
            with sessions() as db, db.begin():
                written = metric_store.insert_points(db, {(ids[key], 0): column})
                if key == "loss":
                    chart_store.refresh_tiers(db, written)
            times.append(time.perf_counter() - start)
    return run.id, ids["loss"], with_tiers, without


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("RANKBOARD_ALLOWED_HOSTS", "testserver")  # the name TestClient sends (app.web.guard)
    with tempfile.TemporaryDirectory() as root:
        settings = Settings(data_dir=Path(root) / "data", shared_dir=Path(root) / "shared", supervise_interval_s=3600)
        app = create_app(settings)
        run_id, series_id, with_tiers, without = build_series(app.state.sessions, args.points)
        last = args.points - 1
        zoom = (last // 2, last // 2 + args.points // 100 - 1)
        with TestClient(app) as client:

            def chart(width: int = 1000, **params: int) -> None:
                response = client.get(f"/api/runs/{run_id}/chart", params={"key": "loss", "width": width, **params})
                assert response.status_code == 200 and len(response.json()["ranks"]["0"]["step"]) <= width

            whole = median_ms(chart, args.repeats)
            zoomed = median_ms(lambda: chart(start_step=zoom[0], end_step=zoom[1]), args.repeats)
            # 250 steps per pixel: the finest tier (16) serves it, so about 16 tier rows per bucket, the most there is.
            widest = median_ms(lambda: chart(width=4000), args.repeats)
        raw = chart_store.ChartPlan(0, last, 0, -(-args.points // 1000), None)
        with app.state.sessions() as db:
            plain = median_ms(
                lambda: chart_store.buckets(db, series_id=series_id, chart=raw, rank=None, last_step=last), 5
            )
    print(f"{args.points:,} points, one rank, width 1000, GET via TestClient, median of {args.repeats}:")
    print(f"  whole range: {whole:.1f} ms; 1% zoom (steps {zoom[0]:,}..{zoom[1]:,}): {zoomed:.1f} ms")
    print(f"  worst case for the tiers, whole range at width 4000 (~16 tier rows per bucket): {widest:.1f} ms")
    print(f"  for comparison, the whole range from the raw points, no tiers: {plain:.0f} ms (median of 5)")
    print(
        f"ingest through the store, {BATCH:,}-point batches: median {statistics.median(without) * 1000:.2f} ms "
        f"without tiers, {statistics.median(with_tiers) * 1000:.2f} ms with them"
    )


if __name__ == "__main__":
    main()
