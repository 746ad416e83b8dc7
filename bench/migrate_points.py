"""Migration 0015 on a store of one row per point: how long it takes, and the bytes before and after, on SQLite.

    .venv/bin/python -m bench.migrate_points [--points 2000000]

Builds the store at 0013_goodput (the schema before the chunks) with 100 runs: `loss` of two ranks at every step,
its times 30-50 ms apart as a trainer's are, values of a falling noisy loss, about 1% NaN. The rows go in through
executemany, not ingest: the store being moved, not its making, is what is measured. Then `alembic upgrade head`,
timed, and the bytes each table takes (SQLite's dbstat) before and after.

Last measured (this 2-core machine, quiet, 2026-11-23), 10,000,000 points: the point table and its indexes 66.3
bytes a point; the upgrade 39.0 s (256,000 points/s); after it, chunks 13.1 bytes a point and tiers 3.2 (this
store's rows went in without tiers: the upgrade built them).
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import time
from pathlib import Path

from alembic.command import upgrade
from sqlalchemy import text
from sqlalchemy.orm import Session

from app.core.db import alembic_config, make_engine
from app.store import metrics as metric_store

RUNS = 100


def build_old_store(url: str, points: int) -> None:
    upgrade(alembic_config(url), "0013_goodput")
    rng = random.Random(0)
    per_run = points // RUNS // 2
    engine = make_engine(url)
    with Session(engine) as db, db.begin():
        for number in range(RUNS):
            # In SQL, as the store was then: today's Run keeps its options in a config document (0017).
            run_id = db.execute(text(
                "INSERT INTO runs (name, status, status_reason, created_at, workload, nproc_per_node, epochs,"
                " batch_size, lr, checkpoint_every, seed, epoch, step, total_steps, samples_per_s, trainer_finished)"
                f" VALUES ('old-{number}', 'succeeded', '', '2026-01-01 00:00:00', 'mlp', 2, 1, 1, 0.1, 1, 0, 0, 0,"
                " 0, 0, 0)"
            )).lastrowid  # fmt: skip
            series = metric_store.series_ids(db, run_id=run_id, keys=["loss"])["loss"]
            now = 1_763_000_000.0 + number * 86_400
            rows = []
            for step in range(per_run):
                now += rng.uniform(0.03, 0.05)
                loss = 2.0 / math.sqrt(step + 1) + rng.gauss(0, 0.01)
                for rank in (0, 1):
                    value = None if rng.random() < 0.01 else loss + rank * 1e-3
                    rows.append((series, step, rank, value, now + rank * 1e-4))
            db.connection().exec_driver_sql(
                "INSERT INTO metric_points (series_id, step, rank, value, time) VALUES (?, ?, ?, ?, ?)", rows
            )
    engine.dispose()


def table_bytes(url: str) -> dict[str, int]:
    engine = make_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")).all()
    engine.dispose()
    return {name: int(size) for name, size in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=2_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        url = f"sqlite:///{Path(root) / 'old.db'}"
        build_old_store(url, args.points)
        before = table_bytes(url)
        points = RUNS * (args.points // RUNS // 2) * 2
        old = sum(size for name, size in before.items() if "metric_points" in name)
        print(f"{points:,} points in the point table and its indexes: {old / points:.1f} bytes a point")
        started = time.perf_counter()
        upgrade(alembic_config(url), "head")
        took = time.perf_counter() - started
        after = table_bytes(url)
        print(f"upgrade to head: {took:.1f} s, {points / took:,.0f} points/s")
        for name in ("metric_chunks", "metric_tiers", "metric_recent"):
            print(f"  {name}: {after.get(name, 0) / points:.2f} bytes a point")


if __name__ == "__main__":
    main()
