"""Ingest throughput over HTTP into SQLite: batches of 1000 points on one kept-alive connection, as the client sends.

    .venv/bin/python -m bench.ingest [--batches 200] [--repeats 5]

Also reports kept-alive request latency (GET /api/health), which guards the uvicorn multi-worker Nagle trap.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from pathlib import Path

from tests.live import LiveServer, open_run
from trainer import wire

TOKEN = "bench-token"


def batch_body(first_step: int, size: int) -> bytes:
    points = tuple(
        wire.Point("loss", step, 1.0 / (step + 1), 0, time.time()) for step in range(first_step, first_step + size)
    )
    return json.dumps(wire.Batch(points).to_json()).encode()


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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        server = LiveServer(Path(root), RANKBOARD_SUPERVISE_INTERVAL_S="3600")
        server.start()
        try:
            run_id = open_run(server, TOKEN)
            rates, step = [], 0
            for _ in range(args.repeats):
                bodies = [batch_body(step + i * args.batch_size, args.batch_size) for i in range(args.batches)]
                step += args.batches * args.batch_size
                rates.append(args.batches * args.batch_size / send_batches(server.port, run_id, bodies))
            retry = send_batches(server.port, run_id, bodies)  # the last round again: every point a duplicate
            latency = keepalive_latency_ms(server.port, 500)
        finally:
            server.stop()
    print(
        f"ingest, batches of {args.batch_size}: median {statistics.median(rates):,.0f} points/s "
        f"(runs: {', '.join(f'{r:,.0f}' for r in rates)}); {step:,} points stored"
    )
    print(f"re-sent batches (all duplicates): {args.batches * args.batch_size / retry:,.0f} points/s")
    print(f"kept-alive GET /api/health: median {latency:.2f} ms")


if __name__ == "__main__":
    main()
