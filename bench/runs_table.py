"""The runs table, compare and delete at 10,000 runs, in SQLite (or PostgreSQL with --postgres).

    .venv/bin/python -m bench.runs_table [--runs 10000] [--points 10000000] [--repeats 15] [--postgres]

How the store is made: the project's own schema (Alembic migrations, via create_app) and its own ingest path,
in-process at the service level: app.services.metrics.ingest, the function POST /api/runs/{id}/metrics calls after
parsing (token check, series, points, chart tiers, the runs table's summaries, progress, all in one transaction),
called with the largest batches it takes (10,000 points) instead of over HTTP, to build the store in minutes.
The runs themselves are inserted as rows (their creation is not what is measured), each with a token, then ingested,
then finished.

The points: 10 "big" runs of --points / 10 points each of `loss` (the compare page's worst case: 10 runs of
1,000,000 points at the default), and every run `loss` and `val_loss` (50 and 10 points) so that every metric filter
and sort has all 10,000 runs to look at; one more run of --big points is deleted at the end.

Timings are medians of --repeats requests through FastAPI's TestClient (routing, validation, rendering and JSON
included; no socket): the runs page and GET /api/runs with a metric condition and a metric sort; a tag search and a
name search; the compare page and the 10 chart requests its charts make (summed: the browser sends them at once);
a run page here and in a store with one run. Then ingest stall: one thread sends 100-point batches into a live run
(through the same service) without pause while the --big run is deleted; the longest and the 99th percentile of
those ingest calls are reported, and the same with no deletion going on, for comparison.

Last measured (this 2-core machine, quiet, 2026-11-23), 10,001 runs and 101,599,500 points, with the points packed
in chunks (app.store.chunks), built in compact batches at 407,800 points/s on SQLite (249 s, 1.40 GB: 13.8 bytes a
point in all; the chunks 10.2, the chart tiers 3.2, the live pages' log 0.24) and 183,000 on PostgreSQL (555 s).
PostgreSQL's size, measured with --sizes-only --points 10000000 (11,599,500 points, 2026-11-23): 33.4 bytes a point
as built (chunks 10.7, chart tiers 11.2, the live pages' log 9.5), 22.0 after VACUUM FULL (chunks 10.7, tiers 9.1,
log 0.74): the rows that the log's trimming and the tiers' updates leave dead take space until (auto)vacuum lets
later writes reuse it. Each PostgreSQL row carries ~24 bytes of header, where SQLite's carry a few.

                                                     SQLite            PostgreSQL 15
    runs page, val_loss.min < 0.9 sorted by -loss.last    29.9 ms           39.8 ms
    GET /api/runs, the same (50 of 8,754 found)           32.9 ms           39.1 ms
    GET /api/runs tag search / name search              42.6 / 41.7 ms    42.9 / 36.7 ms
    runs page, tag search                                 39.3 ms           40.3 ms
    compare page, 10 runs of 10,000,000 points            9.4 ms           24.4 ms
    its 10 loss charts, width 1000, summed               106 ms            188 ms
    run page, 60-point run: here / store of 1 run       6.2 / 7.5 ms     14.8 / 12.0 ms
    ingest of 100 points while deleting 1,000,000,
      max / p99 (nothing deleted)                   36.9 / 5.5 (11.1 / 6.2)  12.5 / 10.9 (14.6 / 12.6) ms
    deleting the 1,000,000-point run                      6.7 s             5.5 s

The trainer's options as keys of each run's config document (0017; `lr < 1e-3` sorted by `-batch_size`, the two
"option" lines), measured apart with `--points 100000 --big 10000` (10,011 runs; the option filter reads only `runs`),
HEAD with the options as columns and then as documents, back to back, medians of 15, two rounds each (this 2-core
machine, shared, 2026-11-27):

                                                  columns          documents
    GET /api/runs, SQLite                      12.9 / 11.8 ms    31.8 / 32.2 ms
    runs page, SQLite                          10.9 / 10.5 ms    29.5 / 29.7 ms
    GET /api/runs, PostgreSQL 15               18.7 / 17.4 ms    30.1 / 29.3 ms (json, not jsonb: 118.7 / 112.8 ms)
    runs page, PostgreSQL 15                   16.8 / 14.6 ms    27.7 / 26.8 ms

SQLite parses each run's document (about 600 bytes) in each pass over the runs, the count's and the page's: 8 ms a
pass at 10,000 runs, the query alone. The metric filter's lines, which also show the option `lr` as a column, took
22.4-24.5 ms before and 27.3-28.4 ms after on SQLite (each run listed carries its document), the same on PostgreSQL.

With one row per point (until 0015), the same store: 269,000 and 49,700 points/s to build, 7.42 GB on SQLite (73.1
bytes a point), 10 charts 157 and 387 ms, run page 10.1 and 416 ms (before the goodput read's fix), deletion 21.7 s.

Earlier, at 11.6M points and load 3 to 7, with the per-point batches of the time (38,000-50,000 points/s through the
service on SQLite, 8,700 on PostgreSQL): the same requests took 28-153 ms, the 10 charts 133-325 ms on SQLite and
1,883 ms on PostgreSQL under load.

Ingest stall while deleting the 1,000,000-point run (100-point batches, max and p99): on SQLite with 20,000-point
deletion batches back to back, max 734 ms (the fix: smaller batches, a pause after each; app.services.run_deletion);
with 5,000 and the pause, 161 / 70 ms against 97 / 27 ms with nothing going on (load ~7), 53 / 26 ms against
25 / 7 ms at load ~3 in a store of 100 runs; with 2,000 (now), 149 / 14 ms against 467 / 9.5 ms (the calm run's
spike is the machine's), deleting in 29.5 s. PostgreSQL (5,000, load ~7): 427 / 117 ms against 611 / 130 ms with
nothing going on: a deletion there takes no lock other runs' inserts wait for; the machine's load dominates.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select, text, update

from app.auth.passwords import sha256 as hash_token
from app.core.models import Run, RunStatus, RunTag
from app.core.settings import Settings
from app.launcher import processes
from app.main import create_app
from app.schemas.metrics import BatchIn
from app.schemas.runs import RunCreate
from app.services import metrics, run_deletion
from bench.chart import median_ms

TOKEN = "bench-t0ken"
BATCH = 10_000  # the most one batch may carry (BatchIn)
TAGS = [f"sweep-{i}" for i in range(50)]


def insert_runs(sessions: Any, count: int, rng: random.Random) -> list[int]:
    """`count` running runs with a token, varied options and a tag or two; their ids."""
    spec = RunCreate()
    me = os.getpid()  # their process: this one, so that a supervisor's tick finds them alive
    rows = [{**spec.columns(), "name": f"{rng.choice(['resnet', 'gpt', 'bert', 'vit'])}-{i}",
             "config": spec.config() | {"lr": rng.choice([1e-4, 3e-4, 1e-3, 3e-3]),
                                        "batch_size": rng.choice([32, 64, 128])},
             "status": RunStatus.running, "status_reason": "", "token_hash": hash_token(TOKEN), "pid": me,
             "pid_start_ticks": processes.start_ticks(me)}
            for i in range(count)]  # fmt: skip
    with sessions() as db, db.begin():
        before = db.scalar(select(func.max(Run.id))) or 0
        db.execute(insert(Run), rows)
        ids = list(db.scalars(select(Run.id).where(Run.id > before).order_by(Run.id)))
        tags = [{"run_id": run_id, "tag": tag} for run_id in ids for tag in rng.sample(TAGS, rng.randint(0, 2))]
        if tags:  # an insert of no rows would insert one of defaults
            db.execute(insert(RunTag), tags)
    return ids


def ingest(sessions: Any, run_id: int, *series_: tuple[str, int, float]) -> int:
    """Through the service, as the ingest endpoint calls it, in compact batches of BATCH points; each series is (key,
    steps, scale), its values a falling loss with noise. Made a batch at a time: 1e8 points never sit in memory."""
    rng, stored = random.Random(run_id), 0
    for key, steps, scale in series_:
        for first in range(1, steps + 1, BATCH):
            numbers = range(first, min(first + BATCH, steps + 1))
            values = [scale * (1 + rng.random()) / (1 + step / 100) for step in numbers]
            column = {"key": key, "steps": list(numbers), "values": values, "times": [1.7e9 + s for s in numbers]}
            with sessions() as db:
                metrics.ingest(db, run_id=run_id, token=TOKEN, batch=BatchIn.model_validate({"columns": [column]}))
            stored += len(values)
    return stored


def build(sessions: Any, *, runs: int, points: int, big: int) -> tuple[list[int], list[int], int, float, int]:
    """The store; returns all run ids, the 10 big runs, the run to delete, seconds spent, points stored."""
    rng = random.Random(15)
    started = time.perf_counter()
    ids = insert_runs(sessions, runs, rng)
    stored = 0
    for run_id in ids[10:]:
        stored += ingest(sessions, run_id, ("loss", 50, 1.0), ("val_loss", 10, 0.8))
    big_runs = ids[:10]
    for run_id in big_runs:
        stored += ingest(sessions, run_id, ("loss", points // 10, 1.0), ("val_loss", 10, 0.8))
        print(f"  {stored:,} points stored, {time.perf_counter() - started:.0f} s", flush=True)
    doomed = insert_runs(sessions, 1, rng)[-1]
    stored += ingest(sessions, doomed, ("loss", big, 1.0))
    with sessions() as db, db.begin():
        db.execute(update(Run).where(Run.id != doomed).values(status=RunStatus.succeeded))
        db.execute(update(Run).where(Run.id == doomed).values(status=RunStatus.succeeded))
    return ids, big_runs, doomed, time.perf_counter() - started, stored


def ingest_stall(app: Any, *, doomed: int | None, live: int, seconds: float) -> tuple[float, float, int]:
    """Ingest latencies (max, p99 in ms, count) of 100-point batches into `live` while `doomed` is deleted (or for
    `seconds` with nothing else going on)."""
    sessions, latencies, stop = app.state.sessions, [], threading.Event()

    def send() -> None:
        step = 1
        while not stop.is_set():
            batch = BatchIn.model_validate({"points": [{"key": "loss", "step": s, "value": 0.5}
                                                       for s in range(step, step + 100)]})  # fmt: skip
            start = time.perf_counter()
            with sessions() as db:
                metrics.ingest(db, run_id=live, token=TOKEN, batch=batch)
            latencies.append(time.perf_counter() - start)
            step += 100

    thread = threading.Thread(target=send)
    thread.start()
    if doomed is None:
        time.sleep(seconds)
    else:
        with sessions() as db:
            run_deletion.delete_run(db, run_id=doomed, folders=app.state.folders, files=False, actor="bench")
    stop.set()
    thread.join()
    ordered = sorted(latencies)
    return ordered[-1] * 1000, ordered[int(len(ordered) * 0.99)] * 1000, len(ordered)


def print_tables(sessions: Any, stored: int, query: str) -> None:
    """The six biggest tables (with their indexes) by the query's (name, bytes) rows."""
    with sessions() as db:
        tables = db.execute(text(query)).all()
    for name, table_bytes in sorted(tables, key=lambda row: -row[1])[:6]:
        print(f"  {name}: {table_bytes / 1e6:,.1f} MB, {table_bytes / stored:.2f} bytes per point")


def print_postgres_sizes(sessions: Any, stored: int) -> None:
    """The database's size as built, whose tables hold the row versions that merging into chunks left (autovacuum
    lets later writes reuse them), and after VACUUM FULL, which packs the live rows alone."""
    tables = "SELECT relname, pg_total_relation_size(relid) FROM pg_stat_user_tables"
    for when in ("as built", "after VACUUM FULL"):
        if when != "as built":
            with sessions() as db:
                db.connection(execution_options={"isolation_level": "AUTOCOMMIT"}).exec_driver_sql("VACUUM FULL")
        with sessions() as db:
            size = db.scalar(text("SELECT pg_database_size(current_database())"))
        print(f"PostgreSQL database, {when}: {size / 1e9:.2f} GB, {size / stored:.1f} bytes per point (tiers included)")
        print_tables(sessions, stored, tables)


@contextlib.contextmanager
def database(postgres: bool, folder: Path) -> Iterator[str | None]:
    if not postgres:
        yield None
        return
    from tests.postgres import new_database, postgres_server

    with postgres_server() as dsn:
        yield new_database(dsn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--points", type=int, default=10_000_000, help="in the 10 big runs together")
    parser.add_argument("--big", type=int, default=1_000_000, help="points of the run deleted")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--sizes-only", action="store_true", help="build the store, print its size, and stop")
    args = parser.parse_args()
    os.environ.setdefault("RANKBOARD_ALLOWED_HOSTS", "testserver")  # the name TestClient sends (app.web.guard)
    with tempfile.TemporaryDirectory() as tmp, database(args.postgres, Path(tmp)) as url:
        root = Path(tmp)
        settings = Settings(data_dir=root / "data", shared_dir=root / "shared", supervise_interval_s=3600,
                            database_url=url)  # fmt: skip
        with TestClient(create_app(settings)) as client:
            app: Any = client.app
            ids, big_runs, doomed, seconds, stored = build(app.state.sessions, runs=args.runs, points=args.points,
                                                           big=args.big)  # fmt: skip
            print(f"store: {len(ids) + 1:,} runs, {stored:,} points in {seconds:.0f} s "
                  f"({stored / seconds:,.0f} points/s through the ingest service)")  # fmt: skip
            if url is None:
                size = sum(f.stat().st_size for f in (root / "data").glob("*.db*"))
                print(f"SQLite files: {size / 1e9:.2f} GB, {size / stored:.1f} bytes per point (tiers included)")
                print_tables(app.state.sessions, stored, "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")
            else:
                print_postgres_sizes(app.state.sessions, stored)
            if args.sizes_only:
                return
            measure(client, ids, big_runs, args.repeats)
            live = insert_runs(app.state.sessions, 1, random.Random(1))[-1]
            calm = ingest_stall(app, doomed=None, live=live, seconds=5)
            started = time.perf_counter()
            during = ingest_stall(app, doomed=doomed, live=live, seconds=0)
            took = time.perf_counter() - started
            print(
                f"ingest of 100 points, nothing else going on: max {calm[0]:.1f} ms, p99 {calm[1]:.1f} ms ({calm[2]})"
            )
            print(f"while deleting the {args.big:,}-point run ({took:.1f} s): max {during[0]:.1f} ms, "
                  f"p99 {during[1]:.1f} ms ({during[2]} batches)")  # fmt: skip
        one_run_page(root / "one", url is not None, args.repeats)


def measure(client: TestClient, ids: list[int], big_runs: list[int], repeats: int) -> None:
    view = {"filter": "val_loss.min < 0.9", "sort": "-loss.last", "columns": "lr,loss.last,val_loss.min"}
    options = {"filter": "lr < 1e-3", "sort": "-batch_size", "columns": "lr,batch_size"}  # keys of config documents
    checks: dict[str, Callable[[], object]] = {
        "GET /api/runs metric filter + metric sort": lambda: client.get("/api/runs", params={**view, "limit": 50}),
        "runs page, metric filter + metric sort": lambda: client.get("/", params=view),
        "GET /api/runs option filter + option sort": lambda: client.get("/api/runs", params={**options, "limit": 50}),
        "runs page, option filter + option sort": lambda: client.get("/", params=options),
        "GET /api/runs tag search (q=sweep-7)": lambda: client.get("/api/runs", params={"q": "sweep-7"}),
        "GET /api/runs name search (q=bert-99)": lambda: client.get("/api/runs", params={"q": "bert-99"}),
        "runs page, tag search": lambda: client.get("/", params={"q": "sweep-7"}),
        "compare page of the 10 big runs": lambda: client.get("/compare", params={"run": big_runs}),
        "its 10 loss charts (summed)": lambda: [
            client.get(f"/api/runs/{run_id}/chart", params={"key": "loss", "width": 1000}) for run_id in big_runs
        ],
        "run page (a 60-point run)": lambda: client.get(f"/runs/{ids[-1]}"),
        "run page (a 1,000,000-point run)": lambda: client.get(f"/runs/{big_runs[0]}"),
    }
    answer = client.get("/api/runs", params={**view, "limit": 50})
    assert answer.status_code == 200, answer.text
    print(f"  (the filter finds {answer.json()['total']:,} runs)")
    for name, action in checks.items():
        answers = action()
        for each in answers if isinstance(answers, list) else [answers]:
            assert each.status_code == 200, (name, each.status_code, each.text[:300])  # type: ignore[attr-defined]
        print(f"{name}: {median_ms(action, repeats):.1f} ms")


def one_run_page(root: Path, postgres: bool, repeats: int) -> None:
    """The same small run's page in a store that holds only it."""
    with database(postgres, root) as url:
        settings = Settings(data_dir=root / "data", shared_dir=root / "shared", supervise_interval_s=3600,
                            database_url=url)  # fmt: skip
        with TestClient(create_app(settings)) as client:
            sessions = client.app.state.sessions  # type: ignore[attr-defined]
            run_id = insert_runs(sessions, 1, random.Random(2))[-1]
            ingest(sessions, run_id, ("loss", 50, 1.0), ("val_loss", 10, 0.8))
            with sessions() as db, db.begin():
                db.execute(update(Run).values(status=RunStatus.succeeded))
            took = median_ms(lambda: client.get(f"/runs/{run_id}"), repeats)
            print(f"run page (a 60-point run) in a store of 1 run: {took:.1f} ms")


if __name__ == "__main__":
    main()
