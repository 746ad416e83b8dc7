"""The supervisor's tick with a long queue of many users: priorities, limits of users and groups, fair share.

    .venv/bin/python -m bench.queue_tick [--queued 0 100 1000 5000] [--users 100] [--repeats 50]

The store, made through the project's own schema: this host's 8 slots held by 8 running runs (this process, so that
the tick finds them alive; not preemptible, so that no tick stops this process), and N queued runs of `--users` users
with random priorities (low, normal, high, numbers) and sizes, a limit of slots for every third user, a default for
everyone (`*`), and ten groups with limits. Nothing fits, so nothing starts: each tick reads the whole queue, decides,
and writes nothing (the reasons of the runs over a limit are written at the first tick, not timed). The tick is
Supervisor.tick (app/workers/supervisor.py), called in process; the decision alone is app.services.scheduling.decide
over the same runs. Figures: the median of --repeats, and the spread (10th to 90th percentile), with fair share off
and on (its usage is one grouped query over the owners' runs).

Last measured (this 2-core machine, shared with three other sessions: load average 6-7, 2026-11-27), 100 repeats,
median [p10-p90] in ms:
    queued   fair share off: a tick     the decision     fair share on: a tick     the decision
         0        2.21 [2.11-2.44]     0.01                  2.36 [2.12-4.94]     0.01
       100        3.13 [3.03-4.15]     0.14                  5.58 [4.22-14.64]    0.14
     1,000        5.66 [5.43-9.02]     0.76 [0.74-0.80]      8.31 [6.48-14.60]    0.86 [0.81-1.89]
     5,000       22.38 [19.67-133.36]  2.68 [2.65-2.96]     49.80 [29.57-173.89]  3.30 [3.13-4.15]
Of a tick at 1,000 queued runs, the 8 running runs' own checks take ~2.2 ms (the 0 row); reading the queue as rows
~0.8 ms (as objects, through the ORM, it was 3x that, and reading the groups as objects 5 ms); the decision <1 ms.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from app.auth.passwords import sha256 as hash_token
from app.core.models import GroupMember, Run, RunStatus, UserGroup, UserLimit, utcnow
from app.core.settings import Settings
from app.launcher import processes
from app.main import create_app
from app.schemas.runs import RunCreate
from app.services import queue, scheduling
from app.store import queue as queue_store

SLOTS = 8
PRIORITIES = (-100, 0, 0, 0, 0, 5, 50, 100)


def timings(action: Callable[[], object], repeats: int) -> tuple[float, float, float]:
    """Median, 10th and 90th percentile, in ms."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    deciles = statistics.quantiles(times, n=10)
    return statistics.median(times), deciles[0], deciles[-1]


def run_rows(count: int, users: int, rng: random.Random, *, status: RunStatus) -> list[dict[str, Any]]:
    """Runs of random owners, priorities and sizes; the running ones this process's, on one slot each."""
    spec, me = RunCreate(), os.getpid()
    rows = []
    for i in range(count):
        running = status == RunStatus.running
        owner = f"user{rng.randrange(users)}"
        rows.append({**spec.columns(), "config": spec.config(), "name": f"q-{i}", "status": status,
                     "status_reason": "created; waiting for free process slots", "owner": owner, "created_by": owner,
                     "priority": rng.choice(PRIORITIES), "nproc_per_node": 1 if running else rng.choice((1, 2, 4, 8)),
                     "preemptible": not running, "started_at": utcnow() if running else None,
                     "token_hash": hash_token(f"t{i}") if running else None, "pid": me if running else None,
                     "pid_start_ticks": processes.start_ticks(me) if running else None,
                     "devices": [i] if running else None})  # fmt: skip
    return rows


def limits(sessions: Any, users: int, rng: random.Random) -> None:
    with sessions() as db, db.begin():
        db.add(UserLimit(user_name=scheduling.EVERYONE, max_slots=16, max_runs=4))
        db.add_all(UserLimit(user_name=f"user{u}", max_slots=rng.choice((2, 4, 8)), max_runs=rng.choice((1, 2, None)))
                   for u in range(0, users, 3))  # fmt: skip
        for g in range(10):
            group = UserGroup(name=f"group{g}", max_slots=rng.choice((8, 16)), max_runs=rng.choice((4, 8, None)))
            db.add(group)
            db.flush()
            db.add_all(GroupMember(group_id=group.id, user_name=f"user{u}") for u in rng.sample(range(users), 15))


def decision_inputs(app: Any) -> tuple[list[scheduling.Waiting], list[scheduling.Holding], scheduling.Policy]:
    """What the tick decides from, read as it reads it."""
    settings, launchers, now = app.state.settings, app.state.launchers, utcnow()
    with app.state.sessions() as db, db.begin():
        waiting = queue.waiting_of(queue_store.waiting(db, launchers=["local"]))
        held = queue.holding_of(queue_store.holding(db, launchers=["local"]), now=now,
                                interval=timedelta(seconds=settings.preempt_interval_s))  # fmt: skip
        rules = queue.policy(db, settings=settings, launchers=launchers, owners={w.owner for w in waiting}, now=now)
    return waiting, held, rules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, nargs="*", default=[0, 100, 1000, 5000])
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    print("queued  users  fair share  a tick: median [p10-p90] ms   the decision alone: median [p10-p90] ms")
    for fair_share in (False, True):
        with tempfile.TemporaryDirectory() as root:
            settings = Settings(data_dir=Path(root) / "data", shared_dir=Path(root) / "shared", slots=SLOTS,
                                launcher="local", fair_share=fair_share)  # fmt: skip
            app = create_app(settings)  # its lifespan, which starts the supervisor's thread, is not entered
            sessions, rng, queued = app.state.sessions, random.Random(0), 0
            with sessions() as db, db.begin():
                db.execute(insert(Run), run_rows(SLOTS, args.users, rng, status=RunStatus.running))
            limits(sessions, args.users, rng)
            for wanted in sorted(args.queued):
                if wanted > queued:
                    with sessions() as db, db.begin():
                        db.execute(insert(Run), run_rows(wanted - queued, args.users, rng, status=RunStatus.queued))
                queued = wanted
                app.state.supervisor.tick()  # the reasons of the runs over a limit: written once, not timed
                tick = timings(app.state.supervisor.tick, args.repeats)
                alone = timings(functools.partial(scheduling.decide, *decision_inputs(app)), args.repeats)
                print(f"{queued:6,}  {args.users:5}  {'on' if fair_share else 'off':>10}  "
                      f"{tick[0]:8.2f} [{tick[1]:.2f}-{tick[2]:.2f}]            "
                      f"{alone[0]:8.2f} [{alone[1]:.2f}-{alone[2]:.2f}]", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
