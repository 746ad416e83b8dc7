"""The server's resident memory while a run takes metrics and 20 run pages stream them: does it grow?

    .venv/bin/python -m bench.server_memory [--seconds 600] [--streams 20] [--rate 10]

A real `rankboard serve` (tests/live.py) on 127.0.0.1; one run takes loss and GPU samples at about `--rate` points
per second, and `--streams` clients read its page's server-sent events (`GET /runs/{id}/stream`) and throw them
away. The server process's RSS is sampled every 10 s; printed: at start, median, max, and the growth from the end
of the first minute (imports, caches and pools warmed up) to the end, which is what a leak would show as.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
from rankboard import wire

from tests.live import LiveServer, open_run

TOKEN = "bench-token"
HOST = "bench-node"
SAMPLE_EVERY_S = 10.0
WARM_UP_S = 60.0


def one_second_of_points(step: int, now: float, rate: int) -> list[wire.Point]:
    """`rate` points: GPU samples of two GPUs at step = unix seconds (as the trainer sends them), the rest loss."""
    gpu = [
        wire.Point(wire.GPU_KEY.format(host=HOST, index=index, field=field), int(now), value, 0, now)
        for index in (0, 1)
        for field, value in (("util", 97.0), ("power", 410.0), ("power_limit", 700.0))
    ][:rate]
    loss = [wire.Point("loss", step + i, 1.0 / (step + i + 1), 0, now) for i in range(rate - len(gpu))]
    return [*loss, *gpu]


async def write(url: str, run_id: int, rate: int, deadline: float) -> int:
    """Posts one batch a second until `deadline`, with a heartbeat as rank 0; returns the points sent."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    sent, step = 0, 0
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
        while time.monotonic() < deadline:
            points = one_second_of_points(step, time.time(), rate)
            step += rate
            heartbeat = wire.Heartbeat(rank=0, host=HOST, step=step)
            batch = wire.Batch(tuple(points), heartbeat=heartbeat).to_json()
            response = await client.post(wire.INGEST_PATH.format(run_id=run_id), json=batch)
            response.raise_for_status()
            sent += len(points)
            await asyncio.sleep(1.0)
    return sent


async def read_stream(client: httpx.AsyncClient, run_id: int, deadline: float, broken: list[str]) -> int:
    """Reads a run page's event stream until `deadline`, discarding it; returns the bytes read. A stream the server
    breaks is opened again, as a browser's EventSource does, and the error is kept in `broken` for the report."""
    received = 0
    try:
        async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
            while True:
                try:
                    async with client.stream("GET", f"/runs/{run_id}/stream") as response:
                        response.raise_for_status()
                        async for chunk in response.aiter_bytes():
                            received += len(chunk)
                except httpx.HTTPError as error:
                    broken.append(f"{type(error).__name__}: {error}")
                await asyncio.sleep(1.0)
    except TimeoutError:
        pass  # the planned end: the stream of a running run never ends by itself
    return received


async def sample_rss(pid: int, deadline: float) -> list[tuple[float, int]]:
    """(seconds since start, RSS bytes) of the server process every SAMPLE_EVERY_S, the last one at the deadline."""
    process, start, samples = psutil.Process(pid), time.monotonic(), []
    while True:
        samples.append((time.monotonic() - start, process.memory_info().rss))
        left = deadline - time.monotonic()
        if left <= 0:
            return samples
        await asyncio.sleep(min(SAMPLE_EVERY_S, left))


@dataclass
class Load:
    """What one run of the benchmark measured."""

    samples: list[tuple[float, int]]  # (seconds since start, server RSS in bytes)
    sent: int  # points ingested
    received: int  # bytes of events read
    broken: list[str]  # errors of streams the server broke


async def load(server: LiveServer, run_id: int, args: argparse.Namespace) -> Load:
    deadline = time.monotonic() + args.seconds
    assert server.process is not None
    limits = httpx.Limits(max_connections=args.streams + 1)
    broken: list[str] = []
    async with httpx.AsyncClient(base_url=server.url, timeout=httpx.Timeout(30, read=None), limits=limits) as client:
        samples, sent, *received = await asyncio.gather(
            sample_rss(server.process.pid, deadline),
            write(server.url, run_id, args.rate, deadline),
            *(read_stream(client, run_id, deadline, broken) for _ in range(args.streams)),
        )
    return Load(samples, sent, sum(received), broken)


def report(result: Load, args: argparse.Namespace) -> None:
    samples, sent, received = result.samples, result.sent, result.received
    mib = [rss / 2**20 for _, rss in samples]
    after_warm_up = [rss / 2**20 for at, rss in samples if at >= WARM_UP_S] or mib[-1:]
    print(f"{args.streams} SSE streams, ~{args.rate} points/s for {args.seconds:.0f} s: {sent:,} points ingested, "
          f"{received / 2**10:,.0f} KiB of events read")  # fmt: skip
    print(f"server RSS: start {mib[0]:.1f} MiB, median {statistics.median(mib):.1f} MiB, max {max(mib):.1f} MiB")
    print(f"growth from the first minute ({after_warm_up[0]:.1f} MiB) to the end ({mib[-1]:.1f} MiB): "
          f"{mib[-1] - after_warm_up[0]:+.1f} MiB")  # fmt: skip
    if result.broken:
        print(f"{len(result.broken)} streams broken by the server and reopened; first: {result.broken[0]}")
    print("samples (s: MiB): " + ", ".join(f"{at:.0f}: {m:.1f}" for (at, _), m in zip(samples, mib, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--streams", type=int, default=20, choices=range(1, 101), metavar="1..100")
    parser.add_argument("--rate", type=int, default=10, choices=range(1, 1001), metavar="1..1000")
    args = parser.parse_args()
    if not 1 <= args.seconds <= 24 * 3600:
        parser.error("--seconds must be between 1 and 86400")
    with tempfile.TemporaryDirectory() as root:
        server = LiveServer(Path(root))
        server.start()
        try:
            run_id = open_run(server, TOKEN)
            result = asyncio.run(load(server, run_id, args))
        finally:
            server.stop()
    report(result, args)


if __name__ == "__main__":
    main()
