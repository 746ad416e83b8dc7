"""The supervisor's tick: the CPU it takes, with one running run and a queue of runs waiting for slots.

    .venv/bin/python -m bench.supervisor_tick [--queued 0 100 1000 5000] [--repeats 50] [--nodes 128]

The server supervises every 0.5 s (RANKBOARD_SUPERVISE_INTERVAL_S) on the node that trains, so what a tick takes is
taken from training (bench/trainer_speed.py). The store, made through the project's own schema: one running run (this
process, so that the tick finds it alive) and N queued runs, each asking for 2 of the server's 1 process slot, so that
they wait. The tick is Supervisor.tick (app/workers/supervisor.py), called in process (no thread, no server).
Figures: the median tick over --repeats, and the share of a core that makes at the default interval.

Last measured (this 2-core machine, 2026-11-23), a tick and its share of a core at one tick every 0.5 s:
    queued runs            0          100          1,000          5,000
    now               1.06 ms      1.07 ms       1.32 ms        2.44 ms   (0.2% to 0.5%)
    reading them all  1.05 ms      6.14 ms      56.87 ms      390.51 ms   (up to 78.1%)
"Reading them all" is the tick before this bench, which read the whole queue twice; reading it once gave 3.32 ms at
100 and 260.52 ms at 5,000: ~0.05 ms a queued run, the cost of loading it as an object. A tick now reads the live
runs and, of the queue, only what it may act on (app.store.runs.runs_to_supervise).

On 2026-11-26 (the same machine, about 3x slower that day), most of a tick turned out to be SQLAlchemy building its
statements (three for the runs to supervise, two for each running run's health), not running them: built once, with
their values bound at each tick, a tick went from 5.29 to 1.54 ms with no queue, 4.86 to 3.23 ms with 1,000 queued
and 10.04 to 7.57 ms with 5,000 (runs_to_supervise alone: 1.38 to 0.30 ms, and 9.74 to 4.05 ms at 5,000).

On 2026-11-27 the queue gained priorities, limits and preemption (issue 42): its decision reaches past the head of
the queue, so a tick reads the whole of it, as plain rows. Both measured in a row (load average 5-6 on 2 cores):
    queued runs            0          100          1,000          5,000
    head only (before)  0.42 ms      0.47 ms       0.63 ms        3.10 ms
    whole queue (now)   0.47 ms      1.00 ms       3.11 ms       17.42 ms   (3.5% of a core at 5,000)
bench/queue_tick.py measures it with 100 users, their limits and groups.

`--nodes N` makes the running run a job of N nodes x 8 GPUs, as its ranks' reports leave it: each node's GPU inventory
in its `gpus`, and a rank row (fresh heartbeat) for each of its N x 8 ranks. On 2026-11-27 (issue 39), no queue, 300
ticks, the tick before and after it stopped loading the nodes' inventory (runs_to_supervise defers Run.gpus), each
measured twice in a row: 1 node 0.62 -> 0.59 ms; 128 nodes (1,024 ranks) 1.08, 1.09 -> 0.68, 0.69 ms.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, update

from app.core.models import Run, RunRank, RunStatus, utcnow
from app.core.settings import Settings
from app.main import create_app
from bench.chart import median_ms
from bench.runs_table import insert_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, nargs="*", default=[0, 100, 1000, 5000])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=0, help="the running run: a job of this many nodes x 8 GPUs")
    args = parser.parse_args()
    interval = Settings.model_fields["supervise_interval_s"].default
    print(f"queued runs  a tick (median)  a core's share at one tick every {interval} s")
    with tempfile.TemporaryDirectory() as root:
        settings = Settings(data_dir=Path(root) / "data", shared_dir=Path(root) / "shared", slots=1, launcher="local")
        app = create_app(settings)  # its lifespan, which starts the supervisor's thread, is not entered
        sessions, rng, queued = app.state.sessions, random.Random(0), 0
        [running] = insert_runs(sessions, 1, rng)
        if args.nodes:
            as_big_job(sessions, running, nodes=args.nodes)
        for wanted in sorted(args.queued):
            waiting = insert_runs(sessions, wanted - queued, rng) if wanted > queued else []
            with sessions() as db, db.begin():
                db.execute(update(Run).where(Run.id.in_(waiting)).values(status=RunStatus.queued, nproc_per_node=2))
            queued = wanted
            tick = median_ms(app.state.supervisor.tick, args.repeats)
            print(f"{queued:11,}  {tick:12.2f} ms  {tick / 1000 / interval:8.1%}", flush=True)


def as_big_job(sessions: Any, run_id: int, *, nodes: int, gpus: int = 8) -> None:
    """The run as a job of `nodes` x `gpus` leaves it: each node's inventory, and a rank row of each of its ranks."""
    inventory = [
        {"host": f"gpu-node-{node:03d}", "nvml_error": None,
         "gpus": [{"index": index, "uuid": f"GPU-{node:03d}-{index}-8f1e2a3b-0000-1111-2222-333344445555",
                   "name": "NVIDIA H100 80GB HBM3"} for index in range(gpus)]}
        for node in range(nodes)
    ]  # fmt: skip
    now = utcnow()
    ranks = [
        {
            "run_id": run_id,
            "rank": rank,
            "host": f"gpu-node-{rank // gpus:03d}",
            "step": 100,
            "heartbeat_at": now + timedelta(hours=1),
        }
        for rank in range(nodes * gpus)
    ]  # fresh all along; fmt: skip
    with sessions() as db, db.begin():
        db.execute(update(Run).where(Run.id == run_id).values(gpus=inventory, started_at=now - timedelta(minutes=5)))
        db.execute(insert(RunRank), ranks)


if __name__ == "__main__":
    main()
