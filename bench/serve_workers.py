"""`rankboard serve --workers N` on PostgreSQL: ingest throughput with 1 and 2 workers, and the latency of requests on
a kept-alive connection with 2 workers, with uvicorn's own listening socket (before) and Rankboard's (after).

    .venv/bin/python -m bench.serve_workers [--seconds 10] [--repeats 3] [--threads 16] [--points 10]

Throughput: a real `rankboard serve` (tests/live.py) on a throwaway PostgreSQL (tests/postgres.py), `--threads` runs
opened as the launcher leaves them, each fed by one thread posting batches of `--points` points (new steps each) on
one kept-alive connection with the trainer's own IngestConnection, as fast as the server answers, for `--seconds`;
posts/s over all threads, and the CPU seconds per second that the server's processes and the posting threads took
(PostgreSQL's are the rest). 1 and 2 workers alternate, `--repeats` times each; printed: median, min and max.

Kept-alive latency: 300 sequential `GET /api/health` on one connection (the first one dropped), median and p90, with 2
workers on each event loop (uvloop, which uvicorn uses when installed, and asyncio, which it uses otherwise) and each
listening socket: uvicorn's (`Config.bind_socket`, protocol 0) or Rankboard's (`app.cli.listening_socket`,
IPPROTO_TCP). This process serves those arms itself (`--serve SOCKET LOOP`), with the same app and options as
`rankboard serve --workers 2`.

bench/big_job.py's PostgreSQL arms with 2 workers should set RANKBOARD_WORKERS=2 (or pass `--workers 2` to serve).

Last measured (this 2-core machine shared with five other engineers' work, load average 7-8; two whole runs):
kept-alive GET with 2 workers, median (p90): uvicorn's socket 0.45 (3.84) / 0.38 (0.45) ms on uvloop and 44.01 (48.01)
/ 44.04 (48.04) ms on asyncio; Rankboard's socket 0.42 (2.38) / 0.44 (2.01) ms on uvloop and 0.45 (0.58) / 0.48
(0.77) ms on asyncio. Throughput, 16 threads, 10 points a post, 10 s, three alternated pairs a run: first run 1 worker
median 291 posts/s (258-294), 2 workers 244 (240-290); second run (the group-commit writer landed meanwhile) 1
worker 213 (213-231), 2 workers 139 (138-213), the server's processes at 0.74-0.85 CPU s/s in every arm, the posting
threads at 0.05-0.07; third run (`--no-latency --repeats 2 --seconds 8`, load 6.6) 1 worker 186 (181-190) at 0.65
server CPU s/s, 2 workers 200 (189-211) at 0.97, the 16 connections split 2/14 and 7/9 between the workers. On two
cores already full (PostgreSQL and the other engineers' work on them too), a second worker buys little or nothing,
and the spread between runs is larger than the difference; in the second run each post cost the server 3.8 ms of
CPU with one worker and 5.9 with two (not profiled yet; each process grouping fewer posts into a commit is the first
suspect). Scaling out wants a machine with cores to spare.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
from rankboard import wire
from rankboard.report import IngestConnection

from tests.live import REPO, LiveServer, free_port, open_run
from tests.postgres import new_database, postgres_server

TOKEN = "bench-token"


def cpu_seconds(server: LiveServer) -> float:
    """CPU time of the server's processes (manager and workers) so far."""
    assert server.process is not None
    processes = [psutil.Process(server.process.pid), *psutil.Process(server.process.pid).children(recursive=True)]
    return sum(p.cpu_times().user + p.cpu_times().system for p in processes)


def connections_per_worker(server: LiveServer) -> list[int]:
    """How many established connections on the server's port each worker holds (which one accepted each)."""
    assert server.process is not None
    return sorted(sum(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == server.port
                      for c in child.net_connections("tcp"))
                  for child in psutil.Process(server.process.pid).children())  # fmt: skip


def throughput(dsn: str, workers: int, args: argparse.Namespace) -> tuple[float, float, float]:
    """Posts/s of `args.threads` threads posting small batches as fast as a server of `workers` answers, and the CPU
    seconds per second of the server's processes and of this one (the posting threads)."""
    server = LiveServer(Path(tempfile.mkdtemp(prefix="rb-workers-")), RANKBOARD_DATABASE_URL=new_database(dsn),
                        RANKBOARD_WORKERS=str(workers))  # fmt: skip
    server.start()
    try:
        run_ids = [open_run(server, TOKEN) for _ in range(args.threads)]
        counts = [0] * len(run_ids)
        deadline = time.monotonic() + args.seconds

        def feed(index: int) -> None:
            connection, step = IngestConnection(server.url, str(run_ids[index]), TOKEN), 0
            while time.monotonic() < deadline:
                points = tuple(
                    wire.Point("loss", s, 1.0 / (s + 1), 0, 1.7e9 + s) for s in range(step, step + args.points)
                )
                status, line, _ = connection.post(json.dumps(wire.Batch(points).to_json()).encode())
                if status != 200:
                    raise RuntimeError(line)
                counts[index], step = counts[index] + 1, step + args.points

        threads = [threading.Thread(target=feed, args=(i,)) for i in range(len(run_ids))]
        server_cpu, client_cpu = cpu_seconds(server), time.process_time()
        for thread in threads:
            thread.start()
        time.sleep(min(1.0, args.seconds / 2))
        print(f"    posting connections per worker: {connections_per_worker(server)}", flush=True)
        for thread in threads:
            thread.join()
        server_cpu, client_cpu = cpu_seconds(server) - server_cpu, time.process_time() - client_cpu
        return sum(counts) / args.seconds, server_cpu / args.seconds, client_cpu / args.seconds
    finally:
        server.stop()


def kept_alive_ms(port: int) -> tuple[float, float]:
    """Median and p90 of 300 sequential requests on one kept-alive connection, in ms."""
    connection, times = http.client.HTTPConnection("127.0.0.1", port, timeout=10), []
    for _ in range(301):
        began = time.perf_counter()
        connection.request("GET", "/api/health")
        connection.getresponse().read()
        times.append((time.perf_counter() - began) * 1000)
    connection.close()
    ordered = sorted(times[1:])
    return statistics.median(ordered), ordered[int(0.9 * len(ordered))]


def latency_arm(dsn: str, sock: str, loop: str) -> tuple[float, float]:
    """Serves with 2 workers, this socket and loop (--serve), and measures kept-alive latency."""
    root, port = Path(tempfile.mkdtemp(prefix="rb-nagle-")), free_port()
    env = {**os.environ, "RANKBOARD_DATA_DIR": str(root / "data"), "RANKBOARD_SHARED_DIR": str(root / "shared"),
           "RANKBOARD_PORT": str(port), "RANKBOARD_WORKERS": "2",
           "RANKBOARD_DATABASE_URL": new_database(dsn)}  # fmt: skip
    with open(root / "server.log", "wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "bench.serve_workers", "--serve", sock, loop], cwd=REPO,
                                  env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        time.sleep(2)  # the second worker up too
        return kept_alive_ms(port)
    finally:
        server.terminate()
        server.wait(30)


def serve(sock: str, loop: str) -> None:
    """`rankboard serve --workers 2`, with uvicorn's listening socket or Rankboard's, on this event loop."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from app import cli
    from app.core.db import make_engine, prepare_schema
    from app.core.settings import Settings

    settings = Settings()
    prepare_schema(make_engine(settings.sqlalchemy_url), settings.sqlalchemy_url)
    config = uvicorn.Config("app.cli:worker_app", factory=True, host=settings.host, port=settings.port, workers=2,
                            loop=loop, **cli.uvicorn_options())  # fmt: skip
    listening = config.bind_socket() if sock == "uvicorn" else cli.listening_socket(settings.host, settings.port)
    Multiprocess(config, sockets=[listening]).run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--points", type=int, default=10)
    parser.add_argument("--no-latency", action="store_true", help="throughput only")
    parser.add_argument("--serve", nargs=2, metavar=("SOCKET", "LOOP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    with postgres_server() as dsn:
        for sock in () if args.no_latency else ("uvicorn", "rankboard"):
            for loop in ("uvloop", "asyncio"):
                median, p90 = latency_arm(dsn, sock, loop)
                print(f"kept-alive GET, 2 workers, {sock}'s socket, {loop}: median {median:.2f} ms, p90 {p90:.2f} ms")
        rates: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.repeats):
            for workers in (1, 2):
                rate, server_cpu, client_cpu = throughput(dsn, workers, args)
                rates[workers].append(rate)
                print(f"  {workers} worker(s): {rate:.0f} posts/s; CPU s/s: server {server_cpu:.2f}, "
                      f"posting threads {client_cpu:.2f}", flush=True)  # fmt: skip
        for workers, values in rates.items():
            print(f"{workers} worker(s): median {statistics.median(values):.0f} posts/s "
                  f"(min {min(values):.0f}, max {max(values):.0f}; {args.threads} threads, "
                  f"{args.points} points a post)")  # fmt: skip


if __name__ == "__main__":
    main()
