"""What a run's reporting costs the server's CPU: per post of rank 0 (its metrics, progress and heartbeat), per
heartbeat of another rank, and per second of a run, against the server's own CPU when no run reports.

    .venv/bin/python -m bench.post_cost [--posts 300] [--steps 100] [--pace 0.05]

A real `rankboard serve` (tests/live.py), supervising at the default interval, and one run opened as the launcher
leaves it. Rank 0's post is what the client sends at each flush of a loop at `--steps` steps a flush: loss, lr,
grad_norm and samples_per_s at each step, with progress and a heartbeat; another rank's is an empty batch with its
heartbeat. Posts go one at a time on one kept-alive connection, `--pace` s apart, so the server is never
saturated; each post's CPU is the server process's over all of them less what it spends in as long idle (a live
run's supervision included), divided by their number. The first 20 posts are not counted: the first request builds
FastAPI's routes.

Last measured (this 2-core machine, SQLite, 2026-11-25; four runs of 200 posts, two before the access log left
accepted batches out, which is not resolved here): rank 0's post of 400 points 11.1 to 13.8 ms of CPU, another rank's
heartbeat 5.5 to 6.2 ms; the server idle 8 to 12 ms a second, one live run's supervision 4 to 8 ms a second more.
So a 2-rank run costs the server ~22 ms of CPU a second (2% of a core) with the client posting once a second: it
posted twice a second until 2026-11-25, ~35 ms. Every post pays ~6 ms of HTTP, FastAPI and a transaction whatever
it carries, so the cost follows the number of posts more than the number of points.

On 2026-11-26 (the same machine, 200 posts, 3 runs alternated with the commit before): with the ingest route asking
FastAPI for only the run id and the token (its session opened on the ingest thread, its reply not checked against the
model again), rank 0's post 12.36 -> 11.27 ms of CPU (medians), another rank's heartbeat 5.22 -> 4.79 ms. Driven in
process through the app's ASGI callable against the service called alone, on the same store: a heartbeat 2.1 to 3.2
ms through the app against 1.0 ms for the service, rank 0's post 9.8 to 10.3 ms against 8.9 to 9.4 ms. So what is
left of a heartbeat is mostly HTTP (uvicorn and FastAPI's middleware); of rank 0's post, the service's statements.

Posting every 5 s instead of every second (RANKBOARD_REPORT_S=5; the same machine, 2026-11-26, two runs of 200 posts
each): rank 0's post of a second at 400 steps/s (--steps 400) 16.0 and 18.3 ms of CPU, of 5 s (--steps 2000) 36.0
and 29.4 ms; another rank's heartbeat 4.5 to 5.5 ms, now sent every 5 s instead of every 2. So a run's posts cost the
server ~17 + 2.5 ms a second for rank 0 and each other rank at the default, ~6.6 + 1 ms at 5 s: 39% as much, for 2
ranks as for 8. A live run's supervision (~5 ms a second) does not change with it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from rankboard import wire

from bench.trainer_speed import SUPERVISE_INTERVAL_S
from tests.live import LiveServer, open_run

TOKEN = "bench-token"
KEYS = ("loss", "lr", "grad_norm", "samples_per_s")
WARM_UP = 20


def rank0_post(index: int, steps: int) -> bytes:
    """Rank 0's flush number `index` of a loop at `steps` steps a flush."""
    first, now = index * steps + 1, time.time()
    step_list = list(range(first, first + steps))
    columns = tuple(wire.Column(key, 0, step_list, [1.0 / s for s in step_list], [now] * steps) for key in KEYS)
    progress = wire.Progress(epoch=1, epochs=1, step=step_list[-1], total_steps=10**9, samples_per_s=1e3)
    batch = wire.Batch(columns=columns, progress=progress, heartbeat=wire.Heartbeat(0, "node", step_list[-1]))
    return json.dumps(batch.to_json(), separators=(",", ":")).encode()


def heartbeat_post(index: int, _steps: int) -> bytes:
    """Another rank's empty batch, which carries its heartbeat."""
    return json.dumps(wire.Batch(heartbeat=wire.Heartbeat(1, "node", index + 1)).to_json()).encode()


class Server:
    """The live server, its process for CPU times, and one run's kept-alive ingest connection."""

    def __init__(self, root: Path) -> None:
        self.live = LiveServer(root, RANKBOARD_SUPERVISE_INTERVAL_S=SUPERVISE_INTERVAL_S)
        self.live.start()
        assert self.live.process is not None
        self.process = psutil.Process(self.live.process.pid)
        self.run_id = 0
        self.connection = http.client.HTTPConnection("127.0.0.1", self.live.port)

    def cpu_s(self) -> float:
        return sum(self.process.cpu_times()[:2])

    def idle_cpu_per_s(self, seconds: float) -> float:
        before = self.cpu_s()
        time.sleep(seconds)
        return (self.cpu_s() - before) / seconds

    def post(self, body: bytes) -> float:
        """Seconds until the reply."""
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        started = time.perf_counter()
        self.connection.request("POST", wire.INGEST_PATH.format(run_id=self.run_id), body, headers)
        reply = self.connection.getresponse()
        reply.read()
        assert reply.status == 200, reply.status
        return time.perf_counter() - started


def per_post(
    server: Server, make: Callable[[int, int], bytes], posts: int, steps: int, pace: float, idle: float
) -> str:
    """The server's CPU per post above idle (ms), and the median reply time."""
    bodies = [make(index, steps) for index in range(posts + WARM_UP)]
    for body in bodies[:WARM_UP]:
        server.post(body)
    before, started, latencies = server.cpu_s(), time.perf_counter(), []
    for body in bodies[WARM_UP:]:
        latencies.append(server.post(body))
        time.sleep(pace)
    used = server.cpu_s() - before - idle * (time.perf_counter() - started)
    return f"{1e3 * used / posts:.2f} ms of CPU a post (reply in {1e3 * statistics.median(latencies):.2f} ms)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=300)
    parser.add_argument("--steps", type=int, default=100, help="steps in a flush of rank 0")
    parser.add_argument("--pace", type=float, default=0.05, help="seconds between posts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder:
        server = Server(Path(folder))
        try:
            time.sleep(2)  # start-up's own work done
            idle = server.idle_cpu_per_s(5)
            server.run_id = open_run(server.live, TOKEN)
            live = server.idle_cpu_per_s(5)
            print(f"server idle: {1e3 * idle:.1f} ms of CPU a second; with a live run: {1e3 * live:.1f}")
            print(f"rank 0, {args.steps} steps x {len(KEYS)} metrics: "
                  + per_post(server, rank0_post, args.posts, args.steps, args.pace, live))  # fmt: skip
            print("another rank's heartbeat: " + per_post(server, heartbeat_post, args.posts, 0, args.pace, live))
        finally:
            server.live.stop()


if __name__ == "__main__":
    main()
