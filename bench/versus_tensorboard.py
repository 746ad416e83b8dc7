"""Rankboard against TensorBoard in one run, interleaved: a chart of a 1,000,000-point series over HTTP, start to
the first healthy answer, and the idle memory of the whole process tree.

    python -m venv /tmp/tb && /tmp/tb/bin/pip install tensorboard       # TensorBoard in a venv of its own, once
    .venv/bin/python -m bench.versus_tensorboard --tensorboard /tmp/tb/bin/python --before /tmp/rb-before
        [--points 1000000] [--blocks 15] [--starts 7] [--big-store /tmp/rb-1e8.db] [--cache /tmp/vs-tb]

`--before` is a checkout of the code to compare with (`git archive <commit> | tar -x -C /tmp/rb-before`), `--after`
the code measured (default: this tree); each serves from a process of its own (`rankboard serve`, PYTHONPATH picks
the tree), TensorBoard as `tensorboard --logdir` (its Rust data server included, as it starts by default).

The series: `loss` of one rank, a falling noisy value with 1% NaN, one point a step, times 40 ms apart; Rankboard's
store built with the code before through its store functions (bench.chart_time.build) and a copy upgraded with the
code after; TensorBoard's event file written with its own writer, the same values. Charts: GET
/api/runs/1/chart?key=loss&width=1000 (whole range, exact min/max/last of every bucket) and a 10% zoom; TensorBoard's
GET /data/plugin/scalars/scalars (its reservoir's 1,000 samples of the whole range: it has no zoom of its own, the
page zooms into that sample). In blocks of REPEATS requests, the servers taking turns, which goes first rotating.
Per request: the wall time at the client and the CPU time of the server's process tree (each process's CPU clock,
threads that ended included: TensorBoard answers each request on a thread of its own; on a loaded machine the
steadier figure). Start: each server started STARTS times in turn on an empty store (a Rankboard data folder made by
a first start, as a user restarts a server; TensorBoard an empty log folder), the time from exec to the first 200 of
its health URL and the CPU its tree used by then; then IDLE_S later the RSS of the whole tree. `--big-store` adds
starts on that store (built with the code before, a copy upgraded with the code after). Reported: medians,
(lowest-highest) of the blocks' medians.

Last measured (issue 43; this 2-core machine shared with three other engineers' tests, load 2-5, TensorBoard 2.21.0
with its data server; before = 186ffcb, after = it with issue 43's change only; wall / CPU ms, medians of 15 blocks of
25): the whole range of 1,000,000 points, TensorBoard 49.6 / 5.40 (its sample of 1,000), before 7.98 / 6.96, after
5.69 / 4.85; a 10% zoom before 8.03 / 7.06, after 6.21 / 5.38. 10,000,000 points (`--without-tensorboard`, 10
blocks): whole 7.46 / 6.55 before, 5.14 / 4.31 after; 10% zoom 8.94 / 7.58 and 6.23 / 5.16. An earlier, quieter run
(load 1.4): 1,000,000 points TensorBoard 49.4 / 5.31, before 7.59 / 6.68, after 5.36 / 4.64. TensorBoard's wall time
is ~45 ms more than its CPU on every request here, whichever client asks (httpx, http.client, curl, one connection or
a new one each time): compare the CPU. Starts, 5 each, in turn (to healthy wall s, CPU s; idle RSS of the tree MiB):
TensorBoard 0.90, 0.49, 84.6; before 1.56, 1.16, 110.5; after 1.74, 0.96, 90.4 (wall spread 1.1-2.7 s on this
machine: read the CPU); on a store of 100,000,000 points before 2.16, 1.21, 110.5 and after 1.63, 0.93, 90.4.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

HERE = Path(__file__).resolve().parents[1]
REPEATS = 25  # requests of a scenario in a block
IDLE_S = 3.0  # from healthy to the memory reading
WRITE_EVENTS = """
import sys, numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
data = np.load(sys.argv[2])
writer = EventFileWriter(sys.argv[1], max_queue_size=10000)
for step, value, when in zip(data["steps"].tolist(), data["values"].tolist(), data["times"].tolist()):
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="loss", simple_value=value)])
    writer.add_event(event_pb2.Event(wall_time=when, step=step, summary=summary))
writer.close()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree_of(pid: int) -> list[psutil.Process]:
    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def cpu_ns(pid: int) -> int:
    """CPU time of the process and its children so far, threads that ended included, in ns: each process's CPU
    clock (Linux's clock id for another process's, as clock_getcpuclockid makes it), where psutil counts in 10 ms
    ticks and TensorBoard's server answers each request on a thread of its own."""
    total = 0
    for process in tree_of(pid):
        with contextlib.suppress(OSError):  # a child that ended since the listing
            total += time.clock_gettime_ns(((~process.pid) << 3) | 2)  # CPUCLOCK_SCHED of the process
    return total


def rss_mib(pid: int) -> float:
    return sum(process.memory_info().rss for process in tree_of(pid)) / 2**20


@dataclass
class Server:
    """A server to start: its command, environment, and the URLs of its health and charts."""

    name: str
    command: list[str]
    env: dict[str, str]
    port: int
    health: str
    cwd: Path | None = None  # `python -m` puts the working folder first on the path, before PYTHONPATH
    charts: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> tuple[float, float]:
        """Starts it; returns the seconds to its first healthy answer and the CPU seconds its tree used by then."""
        started = time.perf_counter()
        self.process = subprocess.Popen(self.command, env=self.env, cwd=self.cwd, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)  # fmt: skip
        url = f"http://127.0.0.1:{self.port}{self.health}"
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.process.returncode} while starting")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return time.perf_counter() - started, cpu_ns(self.process.pid) / 1e9
            except httpx.HTTPError:
                time.sleep(0.005)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None


def rankboard(name: str, tree: Path, root: Path, database: Path | None) -> Server:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree), "RANKBOARD_DATA_DIR": str(root / "data"),
           "RANKBOARD_SHARED_DIR": str(root / "shared"), "RANKBOARD_PORT": str(port)}  # fmt: skip
    if database is not None:
        env["RANKBOARD_DATABASE_URL"] = f"sqlite:///{database}"
    return Server(name, [sys.executable, "-m", "app.cli", "serve"], env, port, "/api/health", cwd=tree)


def tensorboard(python: str, logdir: Path) -> Server:
    port = free_port()
    command = [python, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port), "--host", "127.0.0.1"]
    return Server("TensorBoard", command, dict(os.environ), port, "/data/environment")


def series(points: int, path: Path) -> None:
    """The loss both stores get, as numpy arrays in an .npz: the values bench.chart_time.build stores."""
    import numpy as np

    rng = np.random.default_rng(0)
    steps = np.arange(points)
    values = 1.0 / (steps + 1) + rng.random(points) * 1e-3
    values[rng.random(points) < 0.01] = np.nan
    times = 1_763_000_000.0 + steps * 0.04 + rng.random(points) * 1e-3
    np.savez(path, steps=steps, values=values, times=times)


def prepare(args: argparse.Namespace, cache: Path) -> tuple[Path, Path, Path]:
    """The before store, the after store (a copy, upgraded) and TensorBoard's log folder, made once into `cache`."""
    before_db, after_db, logdir = cache / "before.db", cache / "after.db", cache / "tb"
    if not before_db.exists():
        env = {**os.environ, "PYTHONPATH": str(args.before)}
        build = [sys.executable, str(HERE / "bench" / "chart_time.py"), "build", f"sqlite:///{before_db}.part"]
        subprocess.run([*build, "1", "1", str(args.points)], env=env, check=True)
        os.replace(f"{before_db}.part", before_db)
    if not after_db.exists():
        upgraded(args, before_db, after_db)
    if not logdir.exists() and not args.without_tensorboard:
        series(args.points, cache / "series.npz")
        subprocess.run([args.tensorboard, "-c", WRITE_EVENTS, str(logdir / "run.part"), str(cache / "series.npz")],
                       check=True)  # fmt: skip
        (logdir / "run.part").rename(logdir / "run")
    return before_db, after_db, logdir


def upgraded(args: argparse.Namespace, source: Path, target: Path) -> float:
    """Copies `source` to `target` and upgrades the copy with the code after; returns the upgrade's seconds."""
    shutil.copy(source, f"{target}.part")
    env = {**os.environ, "PYTHONPATH": str(args.after)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"from app.core.db import upgrade; upgrade('sqlite:///{target}.part')"],
                   env=env, check=True)  # fmt: skip
    os.replace(f"{target}.part", target)
    return time.perf_counter() - started


def loaded(server: Server, points: int) -> None:
    """Waits until TensorBoard has read the whole log (its sample ends at the last step)."""
    url = f"http://127.0.0.1:{server.port}/data/plugin/scalars/scalars"
    while True:
        answer = httpx.get(url, params={"run": "run", "tag": "loss"}, timeout=30)
        if answer.status_code == 200 and answer.json() and answer.json()[-1][1] == points - 1:
            return
        time.sleep(1)


Taken = dict[tuple[str, str], list[list[tuple[float, float]]]]  # (server, scenario) -> blocks -> (wall, CPU) ms


def take_turns(servers: list[Server], blocks: int, taken: Taken, action: Callable[[Server, str], None]) -> None:
    for number in range(blocks):
        turn = servers[number % len(servers) :] + servers[: number % len(servers)]
        for server in turn:
            for scenario in server.charts:
                action(server, scenario)


def charts(args: argparse.Namespace, root: Path, stores: tuple[Path, Path, Path]) -> Taken:
    before_db, after_db, logdir = stores
    zoom = f"&start_step={args.points // 2}&end_step={args.points // 2 + args.points // 10 - 1}"
    chart = "/api/runs/1/chart?key=loss&width=1000"
    servers = [tensorboard(args.tensorboard, logdir), rankboard("before", args.before, root / "b", before_db),
               rankboard("after", args.after, root / "a", after_db)]  # fmt: skip
    servers[0].charts = {"whole": "/data/plugin/scalars/scalars?run=run&tag=loss"}
    for server in servers[1:]:
        server.charts = {"whole": chart, "zoom 10%": chart + zoom}
    if args.without_tensorboard:
        servers = servers[1:]
    taken: Taken = {}
    clients = {}
    try:
        for server in servers:
            server.start()
            clients[server.name] = httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30)
        if not args.without_tensorboard:
            loaded(servers[0], args.points)

        def block(server: Server, scenario: str) -> None:
            assert server.process is not None
            times = []
            for _ in range(REPEATS):
                cpu, wall = cpu_ns(server.process.pid), time.perf_counter()
                answer = clients[server.name].get(server.charts[scenario])
                times.append(((time.perf_counter() - wall) * 1e3, (cpu_ns(server.process.pid) - cpu) / 1e6))
                assert answer.status_code == 200, answer.text
            taken.setdefault((server.name, scenario), []).append(times)

        take_turns(servers, 2, {}, block)  # warm: imports, caches, the page cache
        taken.clear()
        take_turns(servers, args.blocks, taken, block)
    finally:
        for server in servers:
            server.stop()
    return taken


def starts(args: argparse.Namespace, root: Path, big: tuple[Path, Path] | None) -> Taken:
    """Start to healthy (wall, CPU) and idle RSS, each server in turn; Rankboard on a store made by a first start."""
    with tempfile.TemporaryDirectory(dir=root) as logdir:
        servers = [tensorboard(args.tensorboard, Path(logdir)), rankboard("before", args.before, root / "sb", None),
                   rankboard("after", args.after, root / "sa", None)]  # fmt: skip
        if big is not None:
            servers += [rankboard("before", args.before, root / "bb", big[0]),
                        rankboard("after", args.after, root / "ba", big[1])]  # fmt: skip
        for server in servers:
            server.charts = {"start, big store" if "RANKBOARD_DATABASE_URL" in server.env else "start": ""}
            if server.name != "TensorBoard" and "RANKBOARD_DATABASE_URL" not in server.env:
                server.start()  # makes the store: later starts find it current
                server.stop()
        taken: Taken = {}

        def start(server: Server, scenario: str) -> None:
            try:
                seconds, cpu = server.start()
                time.sleep(IDLE_S)
                assert server.process is not None
                memory = rss_mib(server.process.pid)
            finally:
                server.stop()
            taken.setdefault((server.name, scenario), []).append([(seconds * 1e3, cpu * 1e3), (memory, memory)])

        take_turns(servers, args.starts, taken, start)
    return taken


def report(taken: Taken, unit: str = "ms") -> None:
    """Per server and scenario: the median of all requests (lowest-highest block median), wall and CPU."""
    for (name, scenario), blocks in sorted(taken.items(), key=lambda item: (item[0][1], item[0][0])):
        parts = []
        for label, column in (("wall", 0), ("CPU", 1)):
            per_block = [statistics.median(value[column] for value in block) for block in blocks]
            every = statistics.median(value[column] for block in blocks for value in block)
            parts.append(f"{label} {every:7.2f} {unit} ({min(per_block):.2f}-{max(per_block):.2f})")
        print(f"  {scenario:18} {name:12} {'; '.join(parts)}")


def report_starts(taken: Taken) -> None:
    for (name, scenario), runs in sorted(taken.items(), key=lambda item: (item[0][1], item[0][0])):
        start, cpu, memory = ([run[0][0] for run in runs], [run[0][1] for run in runs], [run[1][0] for run in runs])
        print(f"  {scenario:18} {name:12} to healthy {statistics.median(start) / 1e3:.3f} s "
              f"({min(start) / 1e3:.3f}-{max(start) / 1e3:.3f}), CPU {statistics.median(cpu) / 1e3:.3f} s "
              f"({min(cpu) / 1e3:.3f}-{max(cpu) / 1e3:.3f}); idle RSS of the tree {statistics.median(memory):.1f} MiB "
              f"({min(memory):.1f}-{max(memory):.1f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensorboard", required=True, help="a python that has tensorboard installed")
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the code to compare with")
    parser.add_argument("--after", type=Path, default=HERE, help="the code to measure (default: this tree)")
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=15, help="blocks of chart requests a server")
    parser.add_argument("--starts", type=int, default=7, help="starts a server")
    parser.add_argument("--big-store", type=Path, help="a store built with the code before, for starts on it")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "versus-tensorboard",
                        help="where the stores and the log are kept between runs")  # fmt: skip
    parser.add_argument("--only", choices=("charts", "starts"), help="one of the two parts")
    parser.add_argument("--without-tensorboard", action="store_true", help="charts of Rankboard only (1e7 points)")
    args = parser.parse_args()
    args.before, args.after = args.before.resolve(), args.after.resolve()
    cache = args.cache / str(args.points)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.cache) as scratch:
        root = Path(scratch)
        if args.only != "starts":
            taken = charts(args, root, prepare(args, cache))
            print(f"charts of {args.points:,} points at width 1000, {args.blocks} blocks of {REPEATS} a server; "
                  "per request, median (lowest-highest block median):")  # fmt: skip
            report(taken)
        if args.only != "charts":
            big = None
            if args.big_store is not None:
                after_big = args.cache / "big-after.db"
                if not after_big.exists():
                    print(f"upgrade of the big store's copy: {upgraded(args, args.big_store, after_big):.1f} s")
                big = (args.big_store, after_big)
            print(f"starts, {args.starts} a server, in turn; idle RSS {IDLE_S:.0f} s after healthy:")
            report_starts(starts(args, root, big))


if __name__ == "__main__":
    main()
