"""Chart reads before and after the tiers kept each bucket's time, on one store: a 10,000,000-point series, or a run
of many keys and ranks (the run page of issue 37).

    .venv/bin/python -m bench.chart_time --before /tmp/wt-before [--steps 10000000] [--blocks 40]
    .venv/bin/python -m bench.chart_time --before /tmp/wt-before --keys 200 --ranks 4 --steps 100000 [--blocks 6]

`--before` is a checkout of the code to compare with (`git worktree add /tmp/wt-before <commit>`, made by hand);
`--after` the code measured, by default this tree. The store is built once, with the code before, through its store
functions (insert_points and refresh_tiers, a transaction per key and 10,000 points, as ingest's batches): each rank
of each key a falling noisy loss with 1% NaN, times 40 ms apart. A copy is upgraded with the code after (timed: 0018
fills the tiers' times), and both files are VACUUMed, so that neither reads a fragmented file.

Then one process per code (PYTHONPATH picks the tree) serves GET /api/runs/{id}/chart through TestClient (routing,
validation and JSON included, no socket), and the two take turns, block by block, which goes first alternating: on a
machine shared with other work, both see the same load. One key: blocks of REPEATS requests each of the whole range
at width 1000, a 1% zoom, and width 4000 (about 16 tier rows per bucket, the tiers' worst case). Many keys: each
block every key's chart at width 600, as a page scrolled to its end asks for them (and its sum). Reported: the
median of all requests, the spread of the blocks' medians (lowest-highest), and after / before of the medians;
after, also the CSV of one key's whole range.

Last measured (this 2-core machine shared with three other engineers' tests, load 6-7, so CPU time per request is
the figure to read; before = f7e09c3, after = it with this change only):
- 10,000,000 points, one rank, 40 blocks of 5 requests a side; CPU ms, median (lowest-highest block median):
  whole range before 7.3 (5.9-8.7), after 7.5 (6.1-9.7), after/before 1.03; 1% zoom 7.9 (6.5-11.3) and 8.3
  (6.9-10.4), 1.05; width 4000 29.3 (26.4-33.1) and 29.8 (27.2-32.5), 1.02. Wall medians: 10.7 / 9.6, 8.3 / 9.3,
  71.8 / 72.1 (0.90, 1.12, 1.00; blocks from 6 to 223 ms). Built in 29 s; the upgrade (0018's backfill) 14.2 s.
- 200 keys x 4 ranks x 100,000 steps would take about 5 minutes to build here (20,000,000 points took 73 s), so
  50 keys of that shape (each key's chart reads the same rows as in the 200-key run): a chart at width 600, CPU
  19.8 ms before (18.2-21.1) and 20.2 after (19.5-21.8), after/before 1.03; wall 39.1 and 39.2. A page of 200 such
  charts: about 200 x 20 ms = 4 s of one core's CPU, spread as they scroll into view. The upgrade 19.3 s. The CSV of
  one key (400,000 points, 19 MB) 2.3 s through TestClient (174,000 points/s), 0.67 s to make in the service.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
BATCH = 10_000  # points per transaction
REPEATS = 5  # requests of each scenario in a block, one key


def key_names(keys: int) -> list[str]:
    """One key: `loss`. Several: W&B-style names in a few sections, as a script's run has them."""
    sections = ("train", "val", "grad", "opt", "data")
    return ["loss"] if keys == 1 else [f"{sections[i % len(sections)]}/metric_{i:03d}" for i in range(keys)]


def build(url: str, keys: int, ranks: int, steps: int) -> None:
    """The run and its series, through the store of whichever tree PYTHONPATH names."""
    import numpy as np
    from sqlalchemy.orm import Session

    from app.core.db import make_engine, upgrade
    from app.core.models import Run, RunStatus
    from app.store import charts as chart_store
    from app.store import chunks
    from app.store import metrics as metric_store

    upgrade(url)
    rng = np.random.default_rng(0)
    engine = make_engine(url)
    with Session(engine) as db, db.begin():
        run = Run(name="bench", status=RunStatus.succeeded, workload="mlp", nproc_per_node=ranks)
        db.add(run)
        db.flush()
        ids = metric_store.series_ids(db, run_id=run.id, keys=key_names(keys))
    window = max(1, BATCH // ranks)
    for first in range(0, steps, window):
        at = np.arange(first, min(first + window, steps))
        for series_id in ids.values():
            columns = {}
            for rank in range(ranks):
                values = 1.0 / (at + 1) + rng.random(len(at)) * 1e-3
                values[rng.random(len(at)) < 0.01] = np.nan
                times = 1_763_000_000.0 + at * 0.04 + rank * 1e-4 + rng.random(len(at)) * 1e-3
                columns[series_id, rank] = chunks.Column(at, values, times)
            with Session(engine) as db, db.begin():
                chart_store.refresh_tiers(db, metric_store.insert_points(db, columns))
    engine.dispose()


def migrate(url: str) -> None:
    from app.core.db import upgrade

    start = time.perf_counter()
    upgrade(url)
    print(json.dumps({"migrate_s": time.perf_counter() - start}))


def serve(url: str, keys: int, steps: int) -> None:
    """Answers each line of stdin, a scenario, with a line of JSON: its requests' times (ms), wall and CPU."""
    from fastapi.testclient import TestClient

    from app.core.settings import Settings
    from app.main import create_app

    os.environ.setdefault("RANKBOARD_ALLOWED_HOSTS", "testserver")  # the name TestClient sends (app.web.guard)
    names = key_names(keys)
    zoom = {"start_step": steps // 2, "end_step": steps // 2 + steps // 100 - 1}
    scenarios: dict[str, list[tuple[str, dict[str, Any]]]] = {
        "whole": [("chart", {"key": "loss", "width": 1000})] * REPEATS,
        "zoom": [("chart", {"key": "loss", "width": 1000, **zoom})] * REPEATS,
        "width4000": [("chart", {"key": "loss", "width": 4000})] * REPEATS,
        "chart600": [("chart", {"key": key, "width": 600}) for key in names],
        "csv": [(f"metrics/{names[0]}", {"format": "csv"})],
    }
    with tempfile.TemporaryDirectory() as root:
        settings = Settings(data_dir=Path(root) / "data", shared_dir=Path(root) / "shared", database_url=url,
                            supervise_interval_s=3600)  # fmt: skip
        with TestClient(create_app(settings)) as client:
            for line in sys.stdin:
                times = []
                for path, params in scenarios[line.strip()]:
                    start, cpu = time.perf_counter(), time.process_time()
                    response = client.get(f"/api/runs/1/{path}", params=params)
                    assert response.status_code == 200 and response.content
                    times.append(((time.perf_counter() - start) * 1000, (time.process_time() - cpu) * 1000))
                print(json.dumps(times), flush=True)


class Server:
    """A `serve` process importing `app` from `tree`."""

    def __init__(self, tree: Path, db: Path, args: argparse.Namespace) -> None:
        command = [sys.executable, __file__, "serve", f"sqlite:///{db}", str(args.keys), str(args.steps)]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, scenario: str) -> list[list[float]]:
        """The times of the scenario's requests: [wall ms, CPU ms] each."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(scenario + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the server of {scenario} ended: {self.process.wait()}")
        return list(json.loads(line))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()


def prepare(args: argparse.Namespace, root: Path) -> tuple[Path, Path]:
    """The store built with the code before, and its copy upgraded with the code after; both VACUUMed."""
    import sqlite3

    before_db, after_db = root / "before.db", root / "after.db"
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(args.before)}
    shape = [str(args.keys), str(args.ranks), str(args.steps)]
    subprocess.run([sys.executable, __file__, "build", f"sqlite:///{before_db}", *shape], env=env, check=True)
    points = args.keys * args.ranks * args.steps
    print(f"built {points:,} points with {args.before} in {time.perf_counter() - start:.0f} s", flush=True)
    shutil.copy(before_db, after_db)
    env["PYTHONPATH"] = str(args.after)
    done = subprocess.run([sys.executable, __file__, "migrate", f"sqlite:///{after_db}"], env=env, check=True,
                          capture_output=True, text=True)  # fmt: skip
    seconds = json.loads(done.stdout.strip().splitlines()[-1])["migrate_s"]
    print(f"upgrade of the copy with {args.after} (0018 fills the tiers' times): {seconds:.1f} s", flush=True)
    for path in (before_db, after_db):
        with sqlite3.connect(path) as connection:
            connection.execute("VACUUM")
    return before_db, after_db


Blocks = dict[tuple[str, str], list[list[list[float]]]]  # (code, scenario) -> blocks -> requests -> [wall, CPU]


def compare(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.tmp) as root:
        before_db, after_db = prepare(args, Path(root))
        servers = {"before": Server(args.before, before_db, args), "after": Server(args.after, after_db, args)}
        scenarios = ["whole", "zoom", "width4000"] if args.keys == 1 else ["chart600"]
        for server in servers.values():  # warm: imports, the page cache
            for scenario in scenarios:
                server.ask(scenario)
        blocks: Blocks = {}
        for number in range(args.blocks):
            for name in ("before", "after") if number % 2 == 0 else ("after", "before"):
                for scenario in scenarios:
                    blocks.setdefault((name, scenario), []).append(servers[name].ask(scenario))
        csv = [servers["after"].ask("csv")[0] for _ in range(3)] if args.keys > 1 else []
        for server in servers.values():
            server.close()
    points = args.keys * args.ranks * args.steps
    print(f"{args.keys} keys x {args.ranks} ranks x {args.steps:,} steps ({points:,} points), {args.blocks} blocks "
          "a side; ms per request: median of all (lowest-highest block median)")  # fmt: skip
    for scenario in scenarios:
        for measure, column in (("CPU", 1), ("wall", 0)):
            print(f"  {scenario:9} {measure:4} {summary(blocks, scenario, column, args.keys)}")
    if csv:
        rows, wall = args.ranks * args.steps, statistics.median(ms for ms, _cpu in csv)
        print(
            f"  CSV of one key's {rows:,} points (after), wall: {wall:.0f} ms "
            f"({min(ms for ms, _ in csv):.0f}-{max(ms for ms, _ in csv):.0f}), {rows / wall * 1000:,.0f} points/s"
        )


def summary(blocks: Blocks, scenario: str, column: int, keys: int) -> str:
    """Before and after, each the median of every request, the spread of the blocks' medians; and their ratio."""
    medians, parts = {}, []
    for name in ("before", "after"):
        taken = [[request[column] for request in block] for block in blocks[name, scenario]]
        per_block = [statistics.median(block) for block in taken]
        medians[name] = statistics.median(ms for block in taken for ms in block)
        parts.append(f"{name} {medians[name]:6.1f} ({min(per_block):.1f}-{max(per_block):.1f})")
        if keys > 1:  # a page of every key's chart
            sums = [sum(block) for block in taken]
            parts[-1] += f", all {keys} keys {statistics.median(sums):.0f} ({min(sums):.0f}-{max(sums):.0f})"
    return f"{'; '.join(parts)}; after/before {medians['after'] / medians['before']:.3f}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("build", "migrate", "serve"):
        command, url, *rest = sys.argv[1:]
        if command == "build":
            build(url, *(int(value) for value in rest))
        elif command == "migrate":
            migrate(url)
        else:
            serve(url, int(rest[0]), int(rest[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the code to compare with")
    parser.add_argument("--after", type=Path, default=HERE, help="the code to measure (default: this tree)")
    parser.add_argument("--keys", type=int, default=1)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10_000_000)
    parser.add_argument("--blocks", type=int, default=40, help="blocks of requests a side")
    parser.add_argument("--tmp", type=Path, default=None, help="where the two stores are built")
    args = parser.parse_args()
    args.before, args.after = args.before.resolve(), args.after.resolve()
    compare(args)


if __name__ == "__main__":
    main()
