"""What cost and usage take to compute: GET /api/usage over 10,000 runs, and the run page's view with and without its
cost part (issue 41).

    .venv/bin/python -m bench.usage [--runs 10000] [--sampled 500] [--repeats 5] [--cache /tmp/rankboard-bench]
        [--rebuild]

The store (SQLite, written through the store as ingest would have left it; kept in `--cache` and reused, upgraded
to the newest schema): `--runs` finished runs over 90 days, each ended 5 hours before the store was built or more
(so all have settled), 2 ranks on 2 H100s each, 1 to 4 hours long, 20 owners, 1 or 2 of 30 tags, each with its
lifecycle events. The newest `--sampled` of them also carry the built-in trainer's goodput ledger (2 ranks) and
their GPUs' power sampled once a second, half of them NVML's energy counter too (once a minute); one more run holds
4 GPUs for 3 hours of samples (43,200 power points, 720 counter points), for the run page.

Usage (`usage.usage`): by user over all time on a store whose runs were never measured (run_costs emptied, as the
migration leaves it: that report measures every settled run, reading its ledger and samples, and stores it); then,
`--repeats` times each, by user over all time and by tag over the last 30 days as the first report of a freshly
started app (a new app, engine and connections in this process: nothing of a report is kept in memory), and as
later reports of one app; and through the API (a TestClient, JSON and CSV) and /metrics: median (lowest-highest).
Run page: `run_page_view` of the 4-GPU run as it is, and with its cost part's computation replaced by its result
(the page before the part), alternated; and `cost.run_cost` alone.

Last measured (2026-11-27, this 2-core machine, load 2-5 from other engineers' work; SQLite; 10,001 runs, 500
sampled, 49,977 GPU-hours; store built in 63 s), before (commit 96f9196: settled runs' measures kept in process
memory; its first report after a start timed by emptying that memory, 3 times each) and after (run_costs):
                                              before                     after
    by user, all time, first after a start:  6.20 s (4.92-6.88)         216 ms (130-237)
    by tag, 30 days, first after a start:    2.67 s (2.50-4.93)          76 ms (72-98)
    by user, all time, later:                 687 ms (635-856)           134 ms (127-222)
    by tag, 30 days, later:                   355 ms (175-380)            70 ms (68-155)
    GET /api/usage?by=user:                   752 ms (683-888)           187 ms (127-240)
    GET /api/usage?by=tag&format=csv:        1.33 s (1.22-1.73)          177 ms (176-284)
    GET /metrics:                                                          35 ms (35-55)
  After, the first report on a store never measured (once after the upgrade, by whichever server process): 4.0 s.
  Of a report now, most is counting 10,000 launches into groups and weeks in Python; the query reads 10,000 rows in
  23 ms. A run live or ended in the last 10 minutes is measured at each report as before (its samples read).
    run page view: 6 ms (6-7) with the cost part, 4 ms (3-4) without; cost.run_cost alone 2 ms (2-3).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.core.db import make_engine, upgrade
from app.core.folders import RunFolders
from app.core.models import LaunchCost, Run, RunEvent, RunStatus, RunTag
from app.core.settings import Settings
from app.main import create_app
from app.schemas.runs import RunCreate
from app.services import cost, run_page, usage
from app.store import chunks
from app.store import metrics as metric_store

H100 = "NVIDIA H100 80GB HBM3"
PRICES = {"H100": 2.49}
NOW = datetime.now(timezone.utc).replace(microsecond=0)
SPREAD = timedelta(days=90)
ENDED = timedelta(hours=5)  # a run lasts up to 4 h 30 s: each has settled (usage.SETTLED) by NOW


def build_store(url: str, *, runs: int, sampled: int) -> int:
    """The runs; returns the id of the 4-GPU run of the run page."""
    upgrade(url)
    engine = make_engine(url)
    rng = np.random.default_rng(0)
    with Session(engine) as db, db.begin():
        for index in range(runs):
            created = NOW - SPREAD + (SPREAD - ENDED) * (index / runs)  # every run ended ENDED ago or more
            db.add(stored_run(index, created, float(rng.uniform(1, 4)) * 3600, gpus=2))
    with Session(engine) as db:
        newest = list(db.scalars(select(Run.id).order_by(Run.id.desc()).limit(sampled)))
    for number, run_id in enumerate(newest):
        with Session(engine) as db, db.begin():
            run = db.get(Run, run_id)
            assert run is not None
            write_samples(db, run, counter=number % 2 == 0, every=1.0)
            write_ledger(db, run)
    with Session(engine) as db, db.begin():
        page = stored_run(runs, NOW - timedelta(hours=4), 3 * 3600, gpus=4)
        db.add(page)
        db.flush()
        write_samples(db, page, counter=True, every=1.0)
        write_ledger(db, page)
        page_id = page.id
    engine.dispose()
    return page_id


def stored_run(index: int, created: datetime, seconds: float, *, gpus: int) -> Run:
    spec = RunCreate(name=f"bench-{index}", nproc_per_node=gpus)
    launch, end = created + timedelta(seconds=30), created + timedelta(seconds=30 + seconds)
    node = {"host": "node-a", "gpus": [{"index": i, "uuid": f"GPU-{i}", "name": H100} for i in range(gpus)]}
    run = Run(**spec.model_dump(exclude={"allow_low_disk"}), status=RunStatus.succeeded, created_at=created,
              started_at=launch, finished_at=end, world_size=gpus, owner=f"user-{index % 20}", gpus=[node])  # fmt: skip
    run.events = [RunEvent(at=created, status=RunStatus.queued, reason="created"),
                  RunEvent(at=launch, status=RunStatus.starting, reason="torchrun started"),
                  RunEvent(at=launch + timedelta(seconds=5), status=RunStatus.running, reason="first progress"),
                  RunEvent(at=end, status=RunStatus.succeeded, reason="training finished")]  # fmt: skip
    run.tag_rows = [RunTag(tag=f"tag-{(index * k) % 30}") for k in range(1, 2 + index % 2)]
    return run


def write_samples(db: Session, run: Run, *, counter: bool, every: float) -> None:
    """Each GPU's power once a second over the launch, its energy counter once a minute."""
    assert run.started_at is not None and run.finished_at is not None
    begin, end = run.started_at.timestamp(), run.finished_at.timestamp()
    times = np.arange(begin, end, every)
    watts = np.round(250 + 150 * np.sin(times / 50), 3)
    columns: dict[tuple[int, int], chunks.Column] = {}
    for gpu in range(len(run.gpus[0]["gpus"])):  # type: ignore[arg-type, index]
        key = wire.GPU_KEY.format(host="node-a", index=gpu, field="{field}")
        ids = metric_store.series_ids(db, run_id=run.id, keys=[key.format(field=f) for f in ("power", "energy")])
        columns[ids[key.format(field="power")], 0] = chunks.Column.of(times.astype(np.int64), watts, times)
        if counter:
            joules = np.round(1e9 + np.cumsum(watts) * every, 3)[::60]
            stamps = times[::60]
            columns[ids[key.format(field="energy")], 0] = chunks.Column.of(stamps.astype(np.int64), joules, stamps)
    metric_store.insert_points(db, columns)


def write_ledger(db: Session, run: Run) -> None:
    """The built-in trainer's one ledger report per rank: start-up, steps, data wait, checkpoints."""
    assert run.started_at is not None and run.finished_at is not None
    start, at = run.started_at.timestamp() + 5, run.finished_at.timestamp() - 10
    held = at - start
    values = {"startup_build": 20.0, "step": 0.9 * held - 20, "data": 0.05 * held, "checkpoint": 0.05 * held,
              "start": start, "at": at, "first_step": 0.0, "step_reached": 1000.0}  # fmt: skip
    keys = {name: wire.GOODPUT_KEY.format(attempt="a.0", field=name) for name in values}
    ids = metric_store.series_ids(db, run_id=run.id, keys=keys.values())
    columns = {(ids[keys[name]], rank): chunks.Column.of([1], [value], [at])
               for name, value in values.items() for rank in range(run.world_size or 1)}  # fmt: skip
    metric_store.insert_points(db, columns)


def timed(work: Callable[[], Any], repeats: int) -> list[float]:
    spans = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        spans.append(time.perf_counter() - started)
    return spans


def said(spans: list[float]) -> str:
    return f"{1000 * statistics.median(spans):.0f} ms ({1000 * min(spans):.0f}-{1000 * max(spans):.0f})"


def measure_usage(settings: Settings, repeats: int) -> None:
    month = NOW - timedelta(days=30)
    reports = {"by user, all time": ("user", None), "by tag, 30 days": ("tag", month)}

    def report(client: TestClient, by: str, start: datetime | None) -> Any:
        with client.app.state.sessions() as db:  # type: ignore[attr-defined]
            return usage.usage(db, by=by, start=start, end=None, prices=PRICES)  # type: ignore[arg-type]

    with TestClient(create_app(settings)) as client, client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.execute(delete(LaunchCost))  # as the migration leaves the store: no run measured yet
    with TestClient(create_app(settings)) as client:
        fill = timed(lambda: report(client, "user", None), 1)
        print(f"  service, by user, all time, the first ever (measures and stores every settled run): {said(fill)}")
    for name, (by, start) in reports.items():
        cold = []
        for _ in range(repeats):  # a server's start: a new app, engine and connections; nothing kept in memory
            with TestClient(create_app(settings)) as client:
                cold += timed(lambda: report(client, by, start), 1)  # noqa: B023
        print(f"  service, {name}, the first after a start: {said(cold)}")
    with TestClient(create_app(settings)) as client:
        found = report(client, "user", None)
        print(f"usage: {found.total.runs} runs, {found.total.gpu_hours:,.0f} GPU-hours, {len(found.rows)} users")
        for name, (by, start) in reports.items():
            print(f"  service, {name}, later:", said(timed(lambda: report(client, by, start), repeats)))  # noqa: B023
        api = timed(lambda: client.get("/api/usage", params={"by": "user"}).raise_for_status(), repeats)
        print("  GET /api/usage?by=user:    ", said(api))
        csv = timed(lambda: client.get("/api/usage", params={"by": "tag", "format": "csv"}).raise_for_status(), 3)
        print("  GET /api/usage?by=tag&format=csv:", said(csv))
        scrape = timed(lambda: client.get("/metrics").raise_for_status(), repeats)
        print("  GET /metrics:              ", said(scrape))


def measure_run_page(settings: Settings, page_id: int, repeats: int) -> None:
    engine = make_engine(settings.sqlalchemy_url)
    folders = RunFolders(settings.shared)

    def view() -> Any:
        with Session(engine) as db:
            return run_page.run_page_view(db, run_id=page_id, folders=folders, settings=settings)

    known = view().cost
    real = run_page.run_cost
    with_part, without = [], []
    for _ in range(repeats):
        with_part += timed(view, 1)
        run_page.run_cost = lambda db, **_: known  # type: ignore[assignment]  # the page as it was before the part
        without += timed(view, 1)
        run_page.run_cost = real
    with Session(engine) as db, db.begin():
        run = db.get(Run, page_id)
        assert run is not None
        from app.services.goodput import run_goodput

        goodput = run_goodput(db, run=run)
        alone = timed(lambda: cost.run_cost(db, run=run, goodput=goodput, prices=PRICES, now=NOW), repeats)
    print(f"run page view (4 GPUs, 3 h sampled, energy by {known.energy_method}, {known.energy_kwh:.2f} kWh):")
    print("  with the cost part:   ", said(with_part))
    print("  without it (before):  ", said(without))
    print("  cost.run_cost alone:  ", said(alone))
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--sampled", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "rankboard-bench")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    data = args.cache / f"usage-{args.runs}x{args.sampled}"
    marker = data / "page-run"
    if args.rebuild or not marker.exists():
        data.mkdir(parents=True, exist_ok=True)
        (data / "rankboard.db").unlink(missing_ok=True)
        started = time.perf_counter()
        page_id = build_store(f"sqlite:///{data / 'rankboard.db'}", runs=args.runs, sampled=args.sampled)
        marker.write_text(str(page_id))
        print(f"store built in {time.perf_counter() - started:.0f} s")
    upgrade(f"sqlite:///{data / 'rankboard.db'}")  # a store built before the newest migration
    settings = Settings(
        data_dir=data,
        shared_dir=data / "shared",
        supervise_interval_s=3600,
        gpu_prices=PRICES,
        prometheus=True,
        allowed_hosts=["testserver"],
    )  # TestClient's Host
    measure_usage(settings, args.repeats)
    measure_run_page(settings, int(marker.read_text()), args.repeats)


if __name__ == "__main__":
    main()
