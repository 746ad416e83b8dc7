"""A big DDP job's reporting against one real server: N nodes x G GPUs posting for a fixed time, as the client posts.

    .venv/bin/python -m bench.big_job [--nodes 128] [--gpus 8] [--seconds 60] [--db sqlite|postgres] [--workers N]
                                      [--posts per-rank|per-node] [--profile out.txt]

A real `rankboard serve` (tests/live.py's environment, supervisor ticking twice a second) with one run opened as the
launcher leaves it. Every second each node posts what its processes report, each body built by the client's own
encoder (`rankboard.report.Reporter._encode`) and posted on a kept-alive `rankboard.report.IngestConnection`:
- its local rank 0's batch: the node's G GPUs x the wire.GPU_FIELDS samples (step = unix second), its inventory on
  the first post; global rank 0 adds the trainer's metrics (loss, lr, grad_norm, samples_per_s) and its progress;
- `--posts per-rank` (the client today): each other rank posts its own heartbeat and step times (wire.RANK_TIME_KEYS);
  `--posts per-node`: each rank's batch encoded by its own reporter, merged as the node's relay merges them
  (`rankboard.relay.merged`: one post, every rank's heartbeat in its list); with a client that has no relay, one
  batch of every rank's columns and local rank 0's heartbeat only.
Steps move on one a second, so no point repeats and nothing dedups. One thread per node; a post that fails is posted
again, as the client does (the server stores a point once).

A separate thread reads the run page's live points stream (`/runs/<id>/stream?parts=points`, watching the loss, one
GPU's utilization and the rank step times) and notes, per point, the time from the start of its post to its arrival.

Printed: posts/s (made of planned), ingest latency p50/p99 (client side; again for the posts after the first
SETTLE_S), point-to-page p50/p99, the server's CPU in cores and RSS (psutil, the server and its worker processes),
points stored vs sent. `--profile` records the server with py-spy (raw collapsed stacks) for the whole load.

This machine has 2 cores shared with the load generator (a few % of a core) and other work: compare figures only
between runs taken back to back. `--no-page` leaves the page out (no point-to-page): the ingest alone.

Last measured (2026-11-27, SQLite, 30 s runs, before = f028989 from a worktree, after = issue 39's group-committing
writer, merged tiers and summaries, cached run and series ids; before and after alternated). On a busy machine
(load 5-8 from other work): 12x8 per-rank, 96 posts/s both, p50/p99 44/1339 -> 12/209 ms; 24x8 per-rank, 134 of 192
posts/s made (p99 1.45 s, 71% of the points stored) -> all 192 (p99 556 ms, all stored); 128x8 per-rank, 120 -> 296
of 1,024 posts/s, both saturated. On a quiet one (load 1-2): 12x8 p99 24 -> 21 ms, 16x8 32 -> 44 ms, 24x8 141 -> 91
ms, CPU 0.40/0.47/0.73 -> 0.39/0.55/0.71, all stored; 128x8 per-node (the relay's one post per node a second), no
page, three runs a side: 81, 97, 83 -> 126, 128, 118 of 128 posts/s, p99 3.8-4.0 -> 1.55-1.67 s, 63-76% -> 92-100%
of the points stored, at 0.9 of a core either way: still saturated. With the run page open, its view
(app.services.findings.stragglers over 1,024 ranks, rendered each second for the points stream too) took ~45% of
the server's CPU. Profiles (py-spy) at 128x8 per-node, no page, both
saturated: before (94 posts/s, 9.6 ms of CPU a post) tiers 32%, chunks' read-merge-write 18%, HTTP and the event
loop 12%, run lookup 10%, live log 6%, series ids 6%, summaries 4%, commit 3%; after (128 posts/s, 7.1 ms a post)
chunks 31%, HTTP and the loop 12%, live log 11%, parsing 10%, summaries 10%, tiers 9%, the rest of the group (columns,
savepoints) 12%, commit 2%, heartbeats 1%, series ids 0.8%, run lookup 0.2%. What is left is per chunk (a node's
post rewrites 88), numpy's cost per call on small arrays.

Then (2026-11-27, issue 39's follow-up: the points stream reads only whether the run is over, not the page's view;
stragglers' median of the others read off one sorted list; the supervisor's tick without the nodes' inventory), 128x8
per-node, 30 s runs, before and after alternated (load 1-3.7), medians of three with the page (ranges): posts/s 69
(64-73) -> 116 (108-120) of 128; ingest p50/p99 2.52/3.81 s -> 1.47/1.70 s; point-to-page p99 6.9 (6.2-8.1) -> 2.87
(2.85-2.89) s; 54% (50-57%) -> 90% (84-94%) of the points stored; 0.96 -> 0.88 of a core. Without the page (two a
side): 99, 122 -> 122, 126 posts/s; p99 2.67, 1.80 -> 1.64, 1.54 s; 77%, 95% -> 95%, 99% stored. Profile after, page
open: chunks 31%, live log 13%, summaries 11%, parsing 8%, tiers 8%, HTTP and the loop 6%, the points stream's reads
5.6% (whether the run is over: 0.1%), the rest of the group 5.5%, commit 2%, series ids 1.5%, heartbeats 1%, the
supervisor 0.1%, the run page's view 0%. Still saturated: the ingest path, chunks first (in
encoding the samples, about half of it, and decoding them, a quarter).

Then (2026-11-27, issue 39's third step: points appended to a chunk as raw records, the live log as raw records, the
summaries merged for all series at once and sent through the driver, no savepoint per post, the collector frozen
after start), SQLite, page open, 30 s runs, before = 61ae595 from a worktree (load 1-2.4): 128x8 posts/s 87, 100,
96, 92 -> 128 (all planned) in each of six runs; ingest p50/p99 1.7-2.0 / 2.0-2.3 s -> 28-215 ms / 0.89-1.19 s;
point-to-page p99 3.1-3.4 s -> 1.68-2.0 s; 68-78% -> all of the points stored; server CPU 0.91-0.93 -> 0.88-0.91.
Without the page, 99 -> 128 posts/s, p99 1.97 s -> 0.69 s. 64x8: p99 212-244 -> 110-135 ms (before the collector)
and 20 ms (with it), CPU 0.75-0.77 -> 0.40. 48x8: p99 132 -> 16 ms, CPU 0.56 -> 0.33. 80x8: p99 25 ms, CPU 0.51,
point-to-page p99 1.06 s: about the largest job one process holds within 0.5 of a core here. The collector alone
(a probe in the server): 0.35 -> 0.07 s a second. Per-thread CPU at 128x8: the ingest writer 0.71 of a core, the
event loop 0.14, the parsing threads 0.06 together: the writer is what saturates, ~5.5 ms a post here (3.1 ms when
the same posts are stored in a quiet process, outside HTTP). PostgreSQL (2 workers) is no better on this machine:
64x8 p50/p99 1.06/1.64 s with 2 workers, 1.01/1.32 s with 1, with the server at 0.7 and PostgreSQL at 0.5 of a core:
every node's post writes the same per-rank series (rank/step_ms...), whose row locks, and the live log's lock, each
writer holds to its commit, so the writers take turns.

Then (2026-11-27, issue 39's fourth step: a point merged into the finest chart tier only, a coarser tier's bucket
built once the series' steps pass it), 30 s runs, before = b83bae0 from a worktree, alternated, on a quiet machine
(load 0.7-1.5). SQLite 128x8 with the page: every post and point stored both sides; ingest p99 93-323 -> 61-527 ms,
server CPU 0.66-0.73 -> 0.58-0.73, point-to-page p99 1.10-1.14 -> 1.09-1.36 s: within the runs' spread; the writer
thread (/proc) 0.547 -> 0.508-0.513 of a core; in its py-spy profile the tiers' share 214 -> 88 samples, the upsert
itself 145 -> 28. PostgreSQL 64x8, 1 process: p50/p99 100-117/432-465 -> 14-47/233-405 ms, CPU 0.61-0.63 -> 0.51-0.61;
2 workers: p50/p99 382-735/695-1088 -> 19-103/400-465 ms, point-to-page p99 1.59-1.96 -> 1.23-1.28 s. The largest
jobs within p99 250 ms and 0.5 of a core here: SQLite 96x8 (p99 20-27 ms, 0.47-0.54 core; 128x8 takes 0.58-0.73),
PostgreSQL with 2 workers 48x8 (p99 179-279 ms, 0.46-0.51 core, PostgreSQL's own CPU on top). Leaving out the live
log entirely (a probe, PostgreSQL 64x8, 2 workers) changed nothing beyond the spread; so did a writer that lingers
5 ms to group more posts (SQLite 128x8: 0.50 of a core either way).

Then (2026-11-27, issue 39's fifth step: a group writes its run's row once, at the commit, where each post's
progress flushed it; a group waits up to 20 ms for the posts of the senders that posted in the last 100 ms, its
transaction, lookups and commit being a fifth of a one-post group's cost; a post's columns cut from one array per
field and its chunks' tails made in one numpy call; the write lock taken through the driver), SQLite 128x8 with the
page, 30 s runs, before = 9a2d0b6 from a worktree, alternated. Quiet (load ~1): server CPU 0.62, 0.64, 0.65 -> 0.56,
0.51, 0.59 of a core; the writer thread 0.52, 0.54 -> 0.40, 0.39; ingest p50 4.6-4.9 -> 26-29 ms (the wait), p99
80-131 -> 77-235 ms; point-to-page p99 1.09-1.12 s both; all stored. Busier (other tenants; before at 0.84): 0.84,
0.84 -> 0.68, 0.71 of a core, p99 after the first 5 s 544-654 -> 352-410 ms. The whole run's p99 is often its first
second's: every node's first post (inventory, ~90 new series) at once. In-process (the writer alone, no HTTP;
128 nodes posting once a second): 0.60 -> 0.47 of a core from the wait alone; 2.81-2.91 -> 2.50-2.59 ms of CPU a post
at groups of 3 from the columns. PostgreSQL 64x8, 2 workers: p50 284-310 -> 176-225 ms, p99 after 5 s 486-561 ->
541-639 ms, server CPU 0.68 -> 0.67 (within the spread). What would go further: a journal of posts, compacted into
the chunks every few seconds, with reads merging what is not compacted yet. Its ceiling, measured in-process by
merging 5 s of posts (groups of 640) per (series, rank) before the chunks: 3.0 -> 1.73 ms a post, 42% less, before
the journal's own row per post.

Then (2026-11-27, issue 39's sixth step: the live log a row per run per group, not per (series, rank); a group's
points in one chunks write; on PostgreSQL the chunks, tiers and summaries written from arrays, one statement each, a
group holding its runs' rows rather than each series', and a run's posts all taking one writer's lane), 30 s runs,
before = 4eeecb8 from a worktree, alternated, load 0.6-1. SQLite 128x8 with the page, six runs a side: server CPU
0.47-0.53 (median 0.49) -> 0.42-0.51 (median 0.43) of a core; the writer thread 0.36-0.41 -> 0.32-0.40; ingest p99
51-240 -> 52-101 ms; point-to-page p99 1.08-1.16 -> 1.04-1.09 s; all stored. The page's stream 0.045 -> 0.007 of a
core (it had read the run's 8,000 series keys at each poll). In-process, the writer's profile at groups of 3: the
live log 0.46 -> 0.13 ms a post, the chunks' write 1.03 -> 0.94. PostgreSQL 128x8, 2 workers (each change against
the one before it): p50 1.18-1.25 s before; PostgreSQL's own CPU 0.68 -> 0.57-0.60 of a core from the arrays, ->
0.53-0.55 from one chunks write a group; the runs' rows held instead of the series' changed nothing measurable; the
lanes took p50 0.48-0.88 -> 0.12-0.14 s and p99 after 5 s 1.1-1.5 -> 0.67-0.77 s, point-to-page p99 1.96-2.16 s, the
server at 0.66-0.67 and PostgreSQL at 0.49 of a core. Four writers a process had shared one job's posts, each
waiting on the others' hold of the run (a quarter of a writer's wall time in the wait, py-spy --idle). The largest
job within p99 250 ms and 0.5 of a core on PostgreSQL with 2 workers is now 64x8 (p99 194 ms, 51 ms after 5 s;
server 0.43, PostgreSQL 0.29 of a core); 96x8 holds p99 119 ms after the first 5 s but takes 0.56 of a core.

Then (2026-11-28, issue 39's seventh step: on PostgreSQL the chunk keys read and every column of numbers sent as
binary arrays (app.core.pg_arrays), where the driver parsed a list of 17,000 markers anew and wrote each number
through a regular expression; a new chunk started as raw records, each (series, rank)'s tail limit staggered and
the chunk before packed when the new one first is, where a job's ~11,000 chunks were all packed in the same second
at each chunk boundary and each full tail; a group's heartbeats in one statement; a group lingering 50 ms on
PostgreSQL), 64 s runs, before = 2d9ce36 from a worktree, alternated, load 1.1-2.6. In-process, the PostgreSQL
writer's own CPU at groups of 8: 4.16 -> 1.5 ms a post. PostgreSQL 128x8, 2 workers, page open, two runs a side:
ingest p99 after the first 5 s 801-911 -> 99-138 ms; server CPU 0.69-0.70 -> 0.48-0.54 of a core; PostgreSQL's own
0.55-0.57 -> 0.48-0.54; point-to-page p99 1.73-1.90 -> 1.29-1.35 s; all stored. One worker (after): p99 102 ms,
0.37 of a core. 160x8 with 2 workers goes past the limits (p99 876 ms; PostgreSQL 0.60 and the server 0.55 of the
machine's 2 cores). SQLite 128x8, page open, two a side: server CPU 0.46-0.47 -> 0.40-0.41, p99 61-100 -> 43-44 ms,
point-to-page p99 1.05 -> 1.04 s. The p99 had been each boundary's seconds: at a step that is a multiple of 64 every
chunk started at once, the second after each was unpacked to take its first tail, and every 16 s all tails filled
at once (in-process, those seconds' groups cost up to 2.3 times the others'; now 1.5 times, at the boundary only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from rankboard import wire
from rankboard.report import IngestConnection, Reporter
from sqlalchemy import text

from app.core.db import make_engine
from tests.live import REPO, LiveServer, open_run, server_sent_events
from tests.postgres import new_database, postgres_server

TOKEN = "bench-token"
METRICS = ("loss", "lr", "grad_norm", "samples_per_s")
GPU_VALUES = {"util": 97.0, "mem_used": 6.1e10, "mem_total": 8.1e10, "temp": 64.0, "power": 612.5,
              "power_limit": 700.0, "sm_clock": 1980.0, "run_mem": 5.9e10}  # fmt: skip
try:
    from rankboard import relay
except (ImportError, AttributeError):  # a client before the per-node relay (or its wire, in an older tree)
    relay = None  # type: ignore[assignment]
HEARTBEATS = relay is not None
DRAIN_S = 10.0
# The first seconds are every node's first post at once (its inventory, ~90 new series): the latency after them is
# reported apart.
SETTLE_S = 5.0


@dataclass
class Figures:
    """What the threads measured: appended to from many threads (list.append holds the GIL)."""

    latencies: list[float] = field(default_factory=list)
    steady: list[float] = field(default_factory=list)  # of posts begun SETTLE_S after the load's start
    planned: list[int] = field(default_factory=lambda: [0])
    sent_points: list[int] = field(default_factory=list)  # of each post made (a retry not counted again)
    accepted: list[int] = field(default_factory=list)  # of each post the server took
    errors: list[str] = field(default_factory=list)
    posted_at: dict[tuple[str, int, int], float] = field(default_factory=dict)  # watched (key, step, rank)
    delays: list[float] = field(default_factory=list)
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (monotonic, server CPU seconds so far)
    rss: list[int] = field(default_factory=list)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


class Node:
    """One node of the job: its ranks' encoders and connections, and what it posts each second."""

    def __init__(self, index: int, args: argparse.Namespace, url: str, run_id: int, spool: Path) -> None:
        self.index, self.gpus, self.per_node = index, args.gpus, args.posts == "per-node"
        self.host = f"node-{index:04d}"
        self.ranks = range(index * args.gpus, (index + 1) * args.gpus)
        posters = self.ranks[:1] if self.per_node else self.ranks
        self.reporters = {rank: Reporter(url, str(run_id), TOKEN, spool, rank=rank, start=False) for rank in posters}
        self.connections = {rank: IngestConnection(url, str(run_id), TOKEN) for rank in posters}
        self.inventory: wire.Node | None = wire.Node(
            self.host, tuple(wire.Gpu(i, f"GPU-{self.host}-{i}", "NVIDIA H100") for i in range(args.gpus))
        )

    def bodies(self, second: int, step: int, watched: set[str]) -> list[tuple[int, bytes, list[tuple], int]]:
        """Each poster's (rank, body, watched points, points) for this second."""
        now = time.time()
        samples = [(wire.GPU_KEY.format(host=self.host, index=gpu, field=name), second, value + gpu, now, self.ranks[0])
                   for gpu in range(self.gpus) for name, value in GPU_VALUES.items()]  # fmt: skip
        bodies = []
        for rank in self.ranks:  # each rank's own batch, as its reporter encodes it
            raw = [(key, step, 100.0 + rank % 7 + n, now, rank) for n, key in enumerate(wire.RANK_TIME_KEYS)]
            raw += samples if rank == self.ranks[0] else []
            progress = None
            if rank == 0:
                raw += [(key, step, 1.0 / (step + 1) + n, now, 0) for n, key in enumerate(METRICS)]
                progress = wire.Progress(epoch=1, epochs=1, step=step, total_steps=10**9, samples_per_s=4096.0)
            node, self.inventory = (self.inventory, None) if rank == self.ranks[0] else (None, self.inventory)
            reporter = self.reporters[self.ranks[0] if self.per_node else rank]
            body = reporter._encode(raw, progress, node=node, heartbeat=wire.Heartbeat(rank, self.host, step))
            bodies.append((rank, body, [p for p in raw if p[0] in watched], len(raw)))
        return self._relayed(bodies) if self.per_node else bodies

    def _relayed(self, bodies: list[tuple[int, bytes, list[tuple], int]]) -> list[tuple[int, bytes, list[tuple], int]]:
        """The node's batches as its relay posts them (rankboard.relay.merged); where the client has no relay yet,
        as one batch by hand: every rank's columns, and local rank 0's heartbeat only."""
        if relay is not None:
            groups = relay.merged([json.loads(body) for _, body, _, _ in bodies])
            return [(self.ranks[0], json.dumps(group.body, separators=(",", ":")).encode(),
                     [p for i in group.members for p in bodies[i][2]], sum(bodies[i][3] for i in group.members))
                    for group in groups]  # fmt: skip
        merged = json.loads(bodies[0][1])
        for _, body, _, _ in bodies[1:]:
            merged["columns"] += json.loads(body)["columns"]
        watched = [p for _, _, points, _ in bodies for p in points]
        return [(self.ranks[0], json.dumps(merged, separators=(",", ":")).encode(), watched, sum(b[3] for b in bodies))]

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()


def post(node: Node, rank: int, body: bytes, figures: Figures, until: float, settled: bool) -> bool:
    """Posts one body until the server takes it (a retry is safe: points are keyed), or the run's time is over."""
    while time.monotonic() < until:
        began = time.perf_counter()
        status, line, _reply = node.connections[rank].post(body)
        took = time.perf_counter() - began
        figures.latencies.append(took)
        if settled:
            figures.steady.append(took)
        if status == 200:
            return True
        if status is not None and status < 500 and status != 429:
            figures.errors.append(f"rank {rank}: {line}")
            return False
        time.sleep(0.2)
    return False


def drive(node: Node, start: float, args: argparse.Namespace, figures: Figures, watched: set[str]) -> None:
    """The node's posts, one round a second from `start` (unix time) for args.seconds, spread over the second."""
    offset = (node.index / args.nodes) % 1.0
    until = time.monotonic() + (start - time.time()) + args.seconds + DRAIN_S
    base = int(start)
    for second in range(args.seconds):
        time.sleep(max(0.0, start + second + offset - time.time()))
        posts = node.bodies(base + second, second + 1, watched)
        figures.planned[0] += len(posts)
        for rank, body, points, size in posts:
            began = time.time()
            for key, step, _value, _at, point_rank in points:
                figures.posted_at.setdefault((key, step, point_rank), began)
            figures.sent_points.append(size)
            if post(node, rank, body, figures, until, settled=began - start >= SETTLE_S):
                figures.accepted.append(size)
    node.close()


def read_stream(url: str, run_id: int, watched: set[str], figures: Figures, stop: threading.Event) -> None:
    """The run page's points stream, as EventSource reads it (reconnecting with Last-Event-ID), until `stop`."""
    last_id: str | None = None
    params = {"parts": "points", "watch": sorted(watched)}
    with httpx.Client(base_url=url, timeout=httpx.Timeout(10, read=5.0)) as client:
        while not stop.is_set():
            headers = {"Last-Event-ID": last_id} if last_id else {}
            try:
                with client.stream("GET", f"/runs/{run_id}/stream", params=params, headers=headers) as response:
                    for message_id, event, data in server_sent_events(response.iter_lines()):
                        last_id = message_id or last_id
                        if event == "points":
                            _arrived(json.loads(data), figures, time.time())
                        if stop.is_set():
                            return
            except httpx.HTTPError:
                time.sleep(0.2)


def _arrived(message: dict, figures: Figures, now: float) -> None:
    for key, series in message["series"].items():
        for step, rank in zip(series["steps"], series["ranks"], strict=True):
            posted = figures.posted_at.get((key, step, rank))
            if posted is not None:
                figures.delays.append(now - posted)


def sample_server(pid: int, figures: Figures, stop: threading.Event) -> None:
    """The server's CPU seconds and RSS each second, its worker processes included."""
    server = psutil.Process(pid)
    while not stop.wait(1.0):
        try:
            processes = [server, *server.children(recursive=True)]
            cpu = sum(sum(p.cpu_times()[:2]) for p in processes)
            figures.rss.append(sum(p.memory_info().rss for p in processes))
        except psutil.Error:
            continue
        figures.cpu.append((time.monotonic(), cpu))


def start_server(root: Path, args: argparse.Namespace, database: dict[str, str]) -> LiveServer:
    """`rankboard serve` in a subprocess (with `--workers` when asked), once it answers."""
    server = LiveServer(root, RANKBOARD_SUPERVISE_INTERVAL_S="0.5", **database)
    log = open(root / "server.log", "ab")  # noqa: SIM115 - closed with the process
    command = [sys.executable, "-m", "app.cli", "serve", *(["--workers", str(args.workers)] if args.workers else [])]
    server.process = subprocess.Popen(command, cwd=REPO, env=server.env, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited: {(root / 'server.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{server.url}/api/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError("server did not answer within 60 s")


def stored_points(url: str, run_id: int) -> int:
    engine = make_engine(url)
    with engine.connect() as connection:
        query = "SELECT SUM(c.n) FROM metric_chunks c JOIN metric_series s ON s.id = c.series_id WHERE s.run_id = :r"
        count = connection.execute(text(query), {"r": run_id}).scalar() or 0
    engine.dispose()
    return int(count)


def args_idle() -> bool:
    return os.environ.get("BIG_JOB_PROFILE_IDLE") == "1"  # threads' waits too: where a post's time goes


def start_profiler(pid: int, out: str) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command = [py_spy, "record", "--pid", str(pid), "--output", out, "--format", "raw", "--rate", "50",
               "--subprocesses", "--nonblocking", *(["--idle"] if args_idle() else [])]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def load(server: LiveServer, run_id: int, args: argparse.Namespace, spool: Path) -> Figures:
    """Runs the job's reporting for args.seconds, with the stream reader and the sampler beside it."""
    assert server.process is not None
    figures, stop = Figures(), threading.Event()
    watched = {"loss", "rank/step_ms", wire.GPU_KEY.format(host="node-0000", index=0, field="util")}
    nodes = [Node(i, args, server.url, run_id, spool) for i in range(args.nodes)]
    start = time.time() + 2.0
    side = [threading.Thread(target=sample_server, args=(server.process.pid, figures, stop))]
    if not args.no_page:
        side.append(threading.Thread(target=read_stream, args=(server.url, run_id, watched, figures, stop)))
    drivers = [threading.Thread(target=drive, args=(node, start, args, figures, watched)) for node in nodes]
    profiler = start_profiler(server.process.pid, args.profile) if args.profile else None
    for thread in side + drivers:
        thread.start()
    for thread in drivers:
        thread.join()
    time.sleep(3.0)  # the page's stream polls once a second: the last points reach it
    stop.set()
    for thread in side:
        thread.join()
    if profiler is not None:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        profiler.communicate(timeout=120)
    return figures


def report(figures: Figures, stored: int, args: argparse.Namespace, log: str) -> None:
    ms, (t0, c0), (t1, c1) = 1000.0, figures.cpu[0], figures.cpu[-1]
    made = len(figures.accepted)
    mode = args.posts + (" (heartbeats list)" if args.posts == "per-node" and HEARTBEATS else "")
    print(f"{args.nodes} nodes x {args.gpus} GPUs, {args.seconds} s, {args.db}, workers {args.workers or 1}, {mode}")
    print(f"  posts/s              {made / args.seconds:8.1f}   ({made:,} made of {figures.planned[0]:,} planned)")
    print(f"  ingest latency       p50 {statistics.median(figures.latencies) * ms:8.1f} ms   "
          f"p99 {percentile(figures.latencies, 0.99) * ms:8.1f} ms")  # fmt: skip
    print(f"    after {SETTLE_S:.0f} s         p50 {percentile(figures.steady, 0.5) * ms:8.1f} ms   "
          f"p99 {percentile(figures.steady, 0.99) * ms:8.1f} ms")  # fmt: skip
    if figures.delays:
        p50, p99 = percentile(figures.delays, 0.5) * ms, percentile(figures.delays, 0.99) * ms
        print(
            f"  point to page        p50 {p50:8.0f} ms   p99 {p99:8.0f} ms   ({len(figures.delays):,} watched points)"
        )
    else:
        print("  point to page        not measured (no page open)")
    print(f"  server CPU           {(c1 - c0) / (t1 - t0):8.2f} cores")
    print(f"  server RSS           median {statistics.median(figures.rss) / 2**20:6.0f} MiB   "
          f"max {max(figures.rss) / 2**20:6.0f} MiB")  # fmt: skip
    print(f"  points stored / sent {stored:,} / {sum(figures.sent_points):,} ({sum(figures.accepted):,} acknowledged)")
    print(f"  errors               {len(figures.errors)} {figures.errors[:3]}")
    print(
        f"  server log: 'database is locked' x{log.count('database is locked')}, tracebacks x{log.count('Traceback')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--workers", type=int, default=0, help="passed to `serve --workers`; 0: not passed")
    parser.add_argument("--posts", choices=("per-rank", "per-node"), default="per-node" if HEARTBEATS else "per-rank")
    parser.add_argument("--profile", help="py-spy's raw collapsed stacks of the server go here")
    parser.add_argument("--log", help="the server's log is copied here")
    parser.add_argument("--no-page", action="store_true", help="no run page open: the ingest alone (no point-to-page)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, ExitStack() as stack:
        database = {}
        if args.db == "postgres":
            database["RANKBOARD_DATABASE_URL"] = new_database(stack.enter_context(postgres_server()))
        server = start_server(Path(root), args, database)
        try:
            run_id = open_run(server, TOKEN)
            spool = Path(root) / "spool"
            spool.mkdir()
            figures = load(server, run_id, args, spool)
        finally:
            server.stop()
        if args.log:
            shutil.copy(Path(root) / "server.log", args.log)
        url = database.get("RANKBOARD_DATABASE_URL") or f"sqlite:///{Path(root) / 'data' / 'rankboard.db'}"
        report(figures, stored_points(url, run_id), args, (Path(root) / "server.log").read_text(errors="replace"))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
