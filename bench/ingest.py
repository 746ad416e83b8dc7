"""Ingest throughput over HTTP into SQLite: batches on one kept-alive connection, as the client sends them, in the
compact format (arrays per metric, what the client sends) or the per-point one (older clients, and spools); and 10
runs posting at once, each on its own connection.

    .venv/bin/python -m bench.ingest [--batches 200] [--batch-size 1000] [--repeats 5] [--format compact|points]
                                     [--postgres]

--postgres runs the server on a throwaway PostgreSQL (tests/postgres.py: fsync off, Unix socket) instead of SQLite.

Also reports kept-alive request latency (GET /api/health), which guards the uvicorn multi-worker Nagle trap.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from rankboard import wire

from tests.live import LiveServer, open_run
from tests.postgres import new_database, postgres_server

TOKEN = "bench-token"


def batch_body(first_step: int, size: int, compact: bool = True) -> bytes:
    steps, now = range(first_step, first_step + size), time.time()
    if compact:
        column = wire.Column("loss", 0, list(steps), [1.0 / (step + 1) for step in steps], [now] * size)
        return json.dumps(wire.Batch(columns=(column,)).to_json()).encode()
    points = tuple(wire.Point("loss", step, 1.0 / (step + 1), 0, now) for step in steps)
    return json.dumps(wire.Batch(points).to_json()).encode()


def concurrent_rate(server: LiveServer, runs: int, batches: int, size: int, compact: bool) -> float:
    """Points per second summed over `runs` runs that each post `batches` batches at once, one connection each."""
    run_ids = [open_run(server, TOKEN) for _ in range(runs)]
    bodies = [batch_body(i * size, size, compact) for i in range(batches)]
    start = time.perf_counter()
    with ThreadPoolExecutor(runs) as pool:
        list(pool.map(lambda run_id: send_batches(server.port, run_id, bodies), run_ids))
    return runs * batches * size / (time.perf_counter() - start)


def send_batches(port: int, run_id: int, bodies: list[bytes]) -> float:
    """Seconds to POST every body in order on one connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    start = time.perf_counter()
    for body in bodies:
        connection.request("POST", wire.INGEST_PATH.format(run_id=run_id), body, headers)
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
    elapsed = time.perf_counter() - start
    connection.close()
    return elapsed


def keepalive_latency_ms(port: int, requests: int) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    times = []
    for _ in range(requests):
        start = time.perf_counter()
        connection.request("GET", "/api/health")
        connection.getresponse().read()
        times.append(time.perf_counter() - start)
    connection.close()
    return statistics.median(times[1:]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--format", choices=("compact", "points"), default="compact")
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    compact = args.format == "compact"
    with tempfile.TemporaryDirectory() as root, ExitStack() as stack:
        database = (
            {"RANKBOARD_DATABASE_URL": new_database(stack.enter_context(postgres_server()))} if args.postgres else {}
        )
        server = LiveServer(Path(root), RANKBOARD_SUPERVISE_INTERVAL_S="3600", **database)
        server.start()
        try:
            run_id = open_run(server, TOKEN)
            rates, step = [], 0
            for _ in range(args.repeats):
                bodies = [batch_body(step + i * args.batch_size, args.batch_size, compact) for i in range(args.batches)]
                step += args.batches * args.batch_size
                rates.append(args.batches * args.batch_size / send_batches(server.port, run_id, bodies))
            retry = send_batches(server.port, run_id, bodies)  # the last round again: every point a duplicate
            latency = keepalive_latency_ms(server.port, 500)
            together = concurrent_rate(server, 10, max(args.batches // 10, 1), args.batch_size, compact)
        finally:
            server.stop()
    print(
        f"ingest into {'PostgreSQL' if args.postgres else 'SQLite'}, {args.format} batches of {args.batch_size}: "
        f"median {statistics.median(rates):,.0f} points/s "
        f"(runs: {', '.join(f'{r:,.0f}' for r in rates)}); {step:,} points stored"
    )
    print(f"re-sent batches (all duplicates): {args.batches * args.batch_size / retry:,.0f} points/s")
    print(f"10 runs posting at once: {together:,.0f} points/s in all")
    print(f"kept-alive GET /api/health: median {latency:.2f} ms")


if __name__ == "__main__":
    main()
