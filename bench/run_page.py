"""The run page of a run with 200 keys in headless Chromium: how soon it paints and fills its first screen, how many
chart requests that takes, and what an open live page of 200 charts costs the server against one of 8 (issue 37).

    .venv/bin/python -m bench.run_page [--keys 200] [--ranks 4] [--steps 100000] [--loads 7] [--pairs 3]
        [--seconds 30] [--steps-per-post 10] [--cache /tmp/rankboard-bench] [--rebuild] [--only loads|live]

The store: two finished runs written through the store (insert_points and refresh_tiers, a transaction per 8,192
steps of 10 keys and every rank), as ingest would have left them. "wide": `--keys` keys of W&B-style names in five
sections (bench.chart_time's names), each reported by `--ranks` ranks for `--steps` steps; "built-in": what the
built-in trainer reports over as many steps, 8 charts (loss, lr, grad_norm and samples/s from rank 0; step time, and
data wait with compute, of each rank). Both carry a node's 4 GPUs' utilization and memory, sampled once a second
(steps 0.1 s apart). The file is kept in `--cache` under a name that says its shape, and the next run of the bench
reuses it (`--rebuild` builds it again); a `rankboard serve` (tests/live.py) serves it (RANKBOARD_DATABASE_URL).

Loads (`--loads` of each page, which first alternating): a fresh browser context (nothing cached) at 1280x900 opens
the run page. Read in the page: first contentful paint (PerformanceObserver 'paint'); when every chart in the first
viewport has drawn (the moment each figure first gets `data-points`, which static/charts/chart.js sets once it drew;
a MutationObserver notes it), from navigation start; the chart requests (GET /api/runs/{id}/chart, from Resource
Timing) started until then, and the most in flight at once; the charts built (those near the viewport) and their
requests, once every one drew; the server's CPU for all that. Then the page's middle chart is scrolled to the top,
as a user scrolling down, and the same is read of that screen from the scroll on.

Live (`--pairs`): a fresh server and two running runs of the same two shapes, each fed by a writer thread that posts
once a second a batch per rank, as the client does (the wide run: each rank its keys for `--steps-per-post` steps;
the built-in run: rank 0 its metrics and every rank's timings, the other ranks a heartbeat), rank 0's with the 4
GPUs' samples. In each pair, for each run in turn (which first alternating): `--seconds` with its page open (from
3 s after its first viewport drew) and `--seconds` with no page, which half first alternating too; the page's cost is
the server process's CPU seconds per second with it open less without. Chromium's CPU is noted alongside. Medians
over the pairs (lowest-highest), and wide / built-in.

This machine has 2 cores: the server, Chromium and this process share them, so compare figures of one run only.

Last measured (this 2-core machine shared with three other engineers' tests, load 3-9, 2026-11-27). The store:
80,080,000 points of the wide run (its GPUs' samples with them) and 1,680,000 of the built-in one, built in 265 s
(302,000 points/s), 1.21 GiB.
Loads, 7 of each, wide (202 charts) / built-in (8 charts), median (lowest-highest):
- first contentful paint 224 (176-480) / 176 (164-264) ms; the HTML (145 / 13 KiB) received at 45 / 24 ms;
- the first viewport drawn at 754 (529-958) / 446 (363-632) ms: it shows 2 charts (the run's status, progress and
  configuration fill the top of 1280x900), and 4 charts are built, those within 400 px: 4 chart requests until
  then, 4 in flight at once, 4 in all; the server's CPU for the load 130 (120-220) / 80 (70-90) ms;
- scrolled to the middle chart, its screen (6 / 4 charts) drawn 731 (604-890) / 272 (244-388) ms after the scroll,
  with 12 / 11 chart requests (one per key: a GPU chart has 4), at most 6 in flight (static/charts/data.js);
- wide / built-in: first paint 1.27, first viewport 1.69, scrolled 2.69.
Live, at 10 steps a second (8,000 points a second into the wide run, 160 into the built-in), 3 pairs of 30 s, two
runs of the bench: an open wide page cost the server 37.3 (32.3-49.3) and 48.0 (35.0-57.9) ms of CPU a second, a
built-in page 23.7 (17.0-24.9) and 23.6 (16.9-25.8): wide / built-in 1.58 and 2.03 (the server ~200 ms a second
without a page, the writers' ingest). Chromium: 61-65 ms a second with the wide page, 25-26 with the built-in one.
At 50 steps a second (one run): 52.0 (-24.4-61.0) against 39.0 (-21.6-45.7), 1.33; too noisy to read beside
ingest's 318 ms a second. What the wide page costs more is its stream: it carries every key's new points (a second
of the wide run is 8,000 points, 405 KiB of JSON, 10 ms of CPU for the JSON alone; the built-in's 160 points, 8 KiB),
of which the page draws those of its 4 built charts.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from operator import attrgetter
from pathlib import Path

import numpy as np
import psutil
from playwright.sync_api import Browser, Page, sync_playwright
from rankboard import wire
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from app.core.db import make_engine, upgrade
from app.core.models import Run, RunStatus
from app.store import charts as chart_store
from app.store import chunks
from app.store import metrics as metric_store
from app.web.stream import POLL_SECONDS
from bench.chart_time import key_names
from bench.trainer_speed import SUPERVISE_INTERVAL_S
from tests.live import LiveServer, open_run, server_db

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]  # fmt: skip
VIEWPORT = {"width": 1280, "height": 900}
TOKEN = "bench-token"
HOST = "bench-node"
GPUS = 4
STEP_S = 0.1  # a stored run's steps are this far apart in time; its GPUs are sampled every 10 steps
WINDOW = 8192  # steps a stored transaction carries: whole chunks and whole tier buckets up to 4,096
KEYS_PER_WRITE = 10
BUILTIN_TOP = ("loss", "lr", "grad_norm", "samples_per_s")  # rank 0's, as trainer/train.py reports them
BUILTIN_RANKS = ("rank/step_ms", "rank/data_ms", "rank/compute_ms")  # every rank's, reported by rank 0
WARM_UP_S = 10.0  # the live runs' writers post this long before anything is measured
MAX_STEPS_PER_POST = 1000  # a rank's second of one key then fits one batch beside the GPUs' samples
SETTLE_S = 3.0  # after a live page's first viewport drew: the charts just below it read too

# Notes in the page what the figures are read from: paint entries, and when each chart first drew.
WATCH = """(() => {
  const bench = window.__bench = { paints: {}, drawn: {} };
  new PerformanceObserver((list) => list.getEntries().forEach((e) => { bench.paints[e.name] = e.startTime; }))
    .observe({ type: "paint", buffered: true });
  performance.setResourceTimingBufferSize(100000);
  new MutationObserver((records) => {
    for (const { target } of records) {
      if (target.matches("figure[data-chart]") && target.dataset.points !== undefined && !(target.id in bench.drawn))
        bench.drawn[target.id] = performance.now();
    }
  }).observe(document, { subtree: true, attributes: true, attributeFilter: ["data-points"] });
})();"""
# The ids of the charts in the viewport once every one of them has drawn; null until then.
IN_VIEW_DRAWN = """() => {
  const inView = Array.from(document.querySelectorAll("figure[data-chart]")).filter((f) => {
    const r = f.getBoundingClientRect();
    return r.height > 0 && r.bottom > 0 && r.top < innerHeight;
  });
  return inView.length && inView.every((f) => f.id in window.__bench.drawn) ? inView.map((f) => f.id) : null;
}"""
EVERY_BUILT_DRAWN = """() => document.querySelectorAll("figure[data-built]").length
  === Object.keys(window.__bench.drawn).length"""
# A screen's figures, given the ids of its charts and when it was asked for (ms since navigation start): how long
# until its last chart drew, and the chart requests (Resource Timing) started meanwhile and in flight at once.
SCREEN = """([ids, since]) => {
  const drawn = Math.max(since, ...ids.map((id) => window.__bench.drawn[id]));
  const charts = performance.getEntriesByType("resource").filter((e) => e.name.includes("/chart?"))
    .filter((e) => e.startTime >= since && e.startTime <= drawn);
  const edges = charts.flatMap((e) => [[e.startTime, 1], [Math.min(e.responseEnd, drawn), -1]])
    .sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let now = 0, most = 0;
  for (const [, step] of edges) { now += step; most = Math.max(most, now); }
  return { drawn: drawn - since, in_view: ids.length, requests: charts.length, in_flight: most };
}"""
# What one load of the page came to once every chart built had drawn.
PAGE = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  return { fcp: window.__bench.paints["first-contentful-paint"] ?? null,
           total: performance.getEntriesByType("resource").filter((e) => e.name.includes("/chart?")).length,
           built: Object.keys(window.__bench.drawn).length,
           figures: document.querySelectorAll("figure[data-chart]").length,
           html_ms: nav.responseEnd, html_kib: nav.decodedBodySize / 1024 };
}"""
# Puts the page's middle chart at the top of the viewport, as a user scrolling down to it; returns when.
SCROLL = """() => {
  const figures = document.querySelectorAll("figure[data-chart]");
  figures[Math.floor(figures.length / 2)].scrollIntoView({ block: "start" });
  return performance.now();
}"""
POINTS_DRAWN = """() => Array.from(document.querySelectorAll("figure[data-points]"))
  .reduce((sum, f) => sum + Number(f.dataset.points), 0)"""


@dataclass(frozen=True)
class Shape:
    """The wide run's size: its keys, the ranks that report each, and their steps."""

    keys: int
    ranks: int
    steps: int

    def file_name(self) -> str:
        return f"run_page-{self.keys}x{self.ranks}x{self.steps}.db"


def gpu_keys() -> list[str]:
    """The keys of the node's GPU samples: each GPU's utilization and memory, a chart of each field."""
    return [wire.GPU_KEY.format(host=HOST, index=i, field=f) for i in range(GPUS) for f in ("util", "mem_used")]


def gpu_sample(key: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """Utilization near 95%, memory near 60 GiB."""
    return 90 + 10 * rng.random(n) if key.endswith("util") else 60 * 2**30 + 2**28 * rng.random(n)


# --- the stored runs


def build_store(url: str, shape: Shape) -> None:
    """The wide and the built-in run, finished, with every point of `shape` and their GPU samples."""
    upgrade(url)
    engine = make_engine(url)
    try:
        started = time.time() - shape.steps * STEP_S
        runs = {name: stored_run(engine, name, shape, started) for name in ("wide", "built-in")}
        rng = np.random.default_rng(0)
        for first in range(1, shape.steps + 1, WINDOW):
            at = np.arange(first, min(first + WINDOW, shape.steps + 1))
            times = started + at * STEP_S
            names = key_names(shape.keys)
            for part in range(0, len(names), KEYS_PER_WRITE):
                wide = {
                    (k, r): falling(at, rng) for k in names[part : part + KEYS_PER_WRITE] for r in range(shape.ranks)
                }
                write_points(engine, runs["wide"], wide, at, times)
            builtin = {(key, 0): falling(at, rng) for key in BUILTIN_TOP}
            builtin |= {(k, r): 50 + rng.random(len(at)) for k in BUILTIN_RANKS for r in range(shape.ranks)}
            write_points(engine, runs["built-in"], builtin, at, times)
            sampled = times[at % 10 == 0]
            for run_id in runs.values():
                gpus = {(key, 0): gpu_sample(key, rng, len(sampled)) for key in gpu_keys()}
                write_points(engine, run_id, gpus, sampled.astype(np.int64), sampled)  # GPU steps are unix seconds
    finally:
        engine.dispose()


def stored_run(engine: Engine, name: str, shape: Shape, started: float) -> int:
    """A finished run that ran `shape.steps` steps from `started`."""
    begun, ended = (datetime.fromtimestamp(t, UTC) for t in (started, started + shape.steps * STEP_S))
    with Session(engine) as db, db.begin():
        run = Run(name=name, status=RunStatus.succeeded, workload="mlp", nproc_per_node=shape.ranks,
                  created_at=begun, started_at=begun, finished_at=ended, step=shape.steps, exit_code=0)  # fmt: skip
        db.add(run)
        db.flush()
        return int(run.id)


def falling(at: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A noisy falling loss at these steps."""
    return 1.0 / np.sqrt(at) + 1e-2 * rng.random(len(at))


def write_points(
    engine: Engine, run_id: int, series: dict[tuple[str, int], np.ndarray], steps: np.ndarray, times: np.ndarray
) -> None:
    """One transaction, as ingest makes one: each (key, rank)'s values at these steps and times, and their tiers."""
    with Session(engine) as db, db.begin():
        ids = metric_store.series_ids(db, run_id=run_id, keys={key for key, _rank in series})
        columns = {(ids[key], rank): chunks.Column(steps, values, times) for (key, rank), values in series.items()}
        chart_store.refresh_tiers(db, metric_store.insert_points(db, columns))


def cached_store(args: argparse.Namespace) -> Path:
    """The stored runs' SQLite file for this shape: the cached one, brought to the newest schema, or built now."""
    shape = Shape(args.keys, args.ranks, args.steps)
    path = args.cache / shape.file_name()
    if path.exists() and not args.rebuild:
        upgrade(f"sqlite:///{path}")
        print(f"store: {path} (cached; --rebuild builds it again)", flush=True)
        return path
    args.cache.mkdir(parents=True, exist_ok=True)
    building = path.with_suffix(".building")
    for stale in (building, path):
        for suffix in ("", "-wal", "-shm"):
            Path(f"{stale}{suffix}").unlink(missing_ok=True)
    points = shape.keys * shape.ranks * shape.steps
    print(f"building {points:,} points of the wide run ({shape.keys} keys x {shape.ranks} ranks x "
          f"{shape.steps:,} steps) in {path} ...", flush=True)  # fmt: skip
    start = time.perf_counter()
    build_store(f"sqlite:///{building}", shape)
    seconds = time.perf_counter() - start
    building.rename(path)
    print(f"built in {seconds:.0f} s ({points / seconds:,.0f} points/s), {path.stat().st_size / 2**30:.2f} GiB",
          flush=True)  # fmt: skip
    return path


# --- the browser


@dataclass(frozen=True)
class Screen:
    """A screenful of charts: how long until every chart in it drew (ms, from navigation start or the scroll), how
    many there are, and the chart requests started meanwhile and in flight at once at most."""

    drawn: float
    in_view: int
    requests: int
    in_flight: int


@dataclass(frozen=True)
class Load:
    """What one load of a run page measured (ms from navigation start), until every chart built had drawn; then
    the screen of the page's middle chart, scrolled to."""

    first: Screen
    fcp: float
    total: int  # chart requests
    built: int  # charts built: those near the viewport
    figures: int  # charts on the page
    html_ms: float  # the page's HTML received
    html_kib: float
    server_cpu_ms: float  # the server's CPU meanwhile
    scrolled: Screen | None = None


@contextmanager
def chromium() -> Iterator[Browser]:
    """Headless Chromium, started as the browser tests start it (tests/e2e/conftest.py)."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def run_page(browser: Browser, server: Server, run_id: int, *, scroll: bool) -> Iterator[tuple[Load, Page]]:
    """A run page opened in a fresh context (nothing cached) until its first viewport drew and every chart built
    has drawn, then (`scroll`) scrolled to its middle chart until that screen drew."""
    context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    try:
        page = context.new_page()
        page.add_init_script(WATCH)
        before = server.cpu_s()
        page.goto(f"{server.live.url}/runs/{run_id}")
        first = page.evaluate(SCREEN, [page.wait_for_function(IN_VIEW_DRAWN, timeout=60_000).json_value(), 0])
        page.wait_for_function(EVERY_BUILT_DRAWN, timeout=60_000)
        load = Load(Screen(**first), **page.evaluate(PAGE), server_cpu_ms=1e3 * (server.cpu_s() - before))
        if load.fcp is None:
            raise RuntimeError(f"run {run_id}: Chromium gave no first-contentful-paint entry")
        if scroll:
            since = page.evaluate(SCROLL)
            in_view = page.wait_for_function(IN_VIEW_DRAWN, timeout=60_000).json_value()
            load = replace(load, scrolled=Screen(**page.evaluate(SCREEN, [in_view, since])))
        yield load, page
    finally:
        context.close()


def load_once(browser: Browser, server: Server, run_id: int) -> Load:
    """One load of a stored run's page, and its scroll to the middle chart."""
    with run_page(browser, server, run_id, scroll=True) as (load, _page):
        return load


class Server:
    """A `rankboard serve` (tests/live.py) at the default supervision interval, and its process for CPU times."""

    def __init__(self, root: Path, **env: str) -> None:
        self.live = LiveServer(root, RANKBOARD_SUPERVISE_INTERVAL_S=SUPERVISE_INTERVAL_S, **env)
        self.live.start()
        assert self.live.process is not None
        self.process = psutil.Process(self.live.process.pid)

    def cpu_s(self) -> float:
        return sum(self.process.cpu_times()[:2])


def page_loads(browser: Browser, server: Server, runs: dict[str, int], loads: int) -> dict[str, list[Load]]:
    """`loads` loads of each run's page, which goes first alternating; one more each before, not counted (it
    compiles the templates and warms the page cache)."""
    for run_id in runs.values():
        load_once(browser, server, run_id)
    taken: dict[str, list[Load]] = {name: [] for name in runs}
    for number in range(loads):
        for name in list(runs) if number % 2 == 0 else list(runs)[::-1]:
            taken[name].append(load_once(browser, server, runs[name]))
    return taken


# --- live pages


def chromium_cpu() -> dict[psutil.Process, float]:
    """The CPU seconds of each Chromium process this benchmark started."""
    times = {}
    for process in psutil.Process().children(recursive=True):
        try:
            if "chrom" in process.name():
                times[process] = sum(process.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
    return times


def chromium_cpu_since(before: dict[psutil.Process, float]) -> float:
    """CPU seconds the Chromium processes alive then and now spent since `before`."""
    now = chromium_cpu()
    return sum(now[process] - seconds for process, seconds in before.items() if process in now)


@dataclass(frozen=True)
class Window:
    """One measured window of a live run: with its page open, or with none."""

    server: float  # the server's CPU seconds per second
    browser: float  # Chromium's CPU seconds per second
    load_s: float = 0.0  # the server's CPU while the page loaded (until SETTLE_S after its first viewport drew)
    load_wall_s: float = 0.0  # how long that was
    points: int = 0  # points the page's charts gained meanwhile: it was live


def measure(server: Server, seconds: float) -> tuple[float, float]:
    """The server's and Chromium's CPU seconds per second over the next `seconds`."""
    cpu, browser, start = server.cpu_s(), chromium_cpu(), time.perf_counter()
    time.sleep(seconds)
    elapsed = time.perf_counter() - start
    return (server.cpu_s() - cpu) / elapsed, chromium_cpu_since(browser) / elapsed


def with_page(browser: Browser, server: Server, run_id: int, seconds: float) -> Window:
    """A window of `seconds` with the run's page open, from SETTLE_S after its first viewport drew."""
    before, start = server.cpu_s(), time.perf_counter()
    with run_page(browser, server, run_id, scroll=False) as (_load, page):
        time.sleep(SETTLE_S)
        load_s, load_wall_s, drawn = server.cpu_s() - before, time.perf_counter() - start, page.evaluate(POINTS_DRAWN)
        cpu, chromium_s = measure(server, seconds)
        grew = page.evaluate(POINTS_DRAWN) - drawn
    time.sleep(2 * POLL_SECONDS)  # the stream's end is seen at its next poll
    return Window(cpu, chromium_s, load_s, load_wall_s, grew)


def live_pairs(
    browser: Browser, server: Server, runs: dict[str, int], args: argparse.Namespace
) -> dict[str, list[tuple[Window, Window]]]:
    """Per run, `args.pairs` pairs of windows (page open, no page); the runs, and the halves of a pair, in turn."""
    for run_id in runs.values():  # not counted: the first page of each fills the server's caches
        with_page(browser, server, run_id, 1)
    pairs: dict[str, list[tuple[Window, Window]]] = {name: [] for name in runs}
    for number in range(args.pairs):
        for turn, name in enumerate(list(runs) if number % 2 == 0 else list(runs)[::-1]):
            if (number + turn) % 2 == 0:
                page = with_page(browser, server, runs[name], args.seconds)
                idle = Window(*measure(server, args.seconds))
            else:
                idle = Window(*measure(server, args.seconds))
                page = with_page(browser, server, runs[name], args.seconds)
            pairs[name].append((page, idle))
    return pairs


def gpu_points(now: float) -> tuple[wire.Point, ...]:
    """One sample of the node's GPUs, at step = unix seconds as the client's sampler sends it."""
    rng = np.random.default_rng()
    return tuple(wire.Point(key, int(now), float(gpu_sample(key, rng, 1)[0]), 0, now) for key in gpu_keys())


def split(
    columns: list[wire.Column],
    heartbeat: wire.Heartbeat,
    points: tuple[wire.Point, ...] = (),
    progress: wire.Progress | None = None,
) -> list[wire.Batch]:
    """Equally long columns in batches of at most the server's limit of points, as the client splits a flush; the
    first batch carries the points and the progress, each the heartbeat."""
    per_batch = (wire.MAX_POINTS_PER_BATCH - len(points)) // len(columns[0].steps)
    return [
        wire.Batch(points if first == 0 else (), progress if first == 0 else None,
                   columns=tuple(columns[first : first + per_batch]), heartbeat=heartbeat)
        for first in range(0, len(columns), per_batch)
    ]  # fmt: skip


def wide_posts(keys: list[str], ranks: int, steps: int) -> Callable[[int], list[wire.Batch]]:
    """Each rank's batches of a second: its every key at `steps` steps; rank 0's with the GPUs' samples."""

    def posts(second: int) -> list[wire.Batch]:
        at, now = list(range(second * steps + 1, (second + 1) * steps + 1)), time.time()
        values, times = (1.0 / np.sqrt(np.array(at))).tolist(), [now] * steps
        return [
            batch
            for rank in range(ranks)
            for batch in split([wire.Column(key, rank, at, values, times) for key in keys],
                               wire.Heartbeat(rank, HOST, at[-1]), gpu_points(now) if rank == 0 else ())
        ]  # fmt: skip

    return posts


def builtin_posts(ranks: int, steps: int) -> Callable[[int], list[wire.Batch]]:
    """Rank 0's batches of a second as the built-in trainer's (its metrics, every rank's timings, the GPUs'
    samples), and each other rank's heartbeat."""

    def posts(second: int) -> list[wire.Batch]:
        at, now = list(range(second * steps + 1, (second + 1) * steps + 1)), time.time()
        values, times = (1.0 / np.sqrt(np.array(at))).tolist(), [now] * steps
        columns = [wire.Column(key, 0, at, values, times) for key in BUILTIN_TOP]
        columns += [wire.Column(key, rank, at, [50.0] * steps, times) for key in BUILTIN_RANKS for rank in range(ranks)]
        progress = wire.Progress(epoch=0, epochs=1, step=at[-1], total_steps=10**9, samples_per_s=1e3)
        first = split(columns, wire.Heartbeat(0, HOST, at[-1]), gpu_points(now), progress)
        return [*first, *(wire.Batch(heartbeat=wire.Heartbeat(rank, HOST, at[-1])) for rank in range(1, ranks))]

    return posts


class Writer(threading.Thread):
    """Posts a run's batches once a second, one POST per rank on one kept-alive connection, as the ranks' clients
    post theirs; counts the batches posted and keeps what went wrong."""

    def __init__(self, port: int, run_id: int, posts: Callable[[int], list[wire.Batch]]) -> None:
        super().__init__(daemon=True)
        self.port, self.path, self.posts = port, wire.INGEST_PATH.format(run_id=run_id), posts
        self.stopping = threading.Event()
        self.posted = 0
        self.failed: list[str] = []

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        second, next_at = 0, time.monotonic()
        while not self.stopping.is_set():
            for batch in self.posts(second):
                try:
                    connection.request("POST", self.path, json.dumps(batch.to_json()).encode(), headers)
                    reply = connection.getresponse()
                    reply.read()
                    if reply.status != 200:
                        self.failed.append(f"HTTP {reply.status}")
                    self.posted += 1
                except (OSError, http.client.HTTPException) as error:
                    self.failed.append(f"{type(error).__name__}: {error}")
                    connection.close()
            second, next_at = second + 1, next_at + 1.0
            self.stopping.wait(max(0.0, next_at - time.monotonic()))
        connection.close()


# --- the report

LOAD_ROWS = (  # (label, a Load's attribute)
    ("first contentful paint, ms", "fcp"),
    ("first viewport: every chart drawn, ms", "first.drawn"),
    ("  charts in it", "first.in_view"),
    ("  chart requests until then", "first.requests"),
    ("  most in flight at once", "first.in_flight"),
    ("charts built (near the viewport)", "built"),
    ("  chart requests until they drew", "total"),
    ("page HTML received, ms", "html_ms"),
    ("page HTML, KiB", "html_kib"),
    ("server CPU for the load, ms", "server_cpu_ms"),
    ("scrolled to the middle chart: drawn, ms", "scrolled.drawn"),
    ("  charts in view", "scrolled.in_view"),
    ("  chart requests meanwhile", "scrolled.requests"),
    ("  most in flight at once", "scrolled.in_flight"),
)


def spread(values: list[float], digits: int = 0) -> str:
    """The median (lowest-highest)."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def report_loads(taken: dict[str, list[Load]]) -> None:
    """Each figure of the loads per run, and wide / built-in of the times."""
    charts = ", ".join(f"{name}: {loads[0].figures} charts" for name, loads in taken.items())
    print(f"page loads, {len(next(iter(taken.values())))} of each ({charts}): median (lowest-highest)")
    for label, field in LOAD_ROWS:
        read = attrgetter(field)
        print(f"  {label:40}" + "; ".join(f"{name} {spread([read(load) for load in loads])}"
                                         for name, loads in taken.items()))  # fmt: skip
    ratios = []
    for label, field in (("first paint", "fcp"), ("first viewport", "first.drawn"), ("scrolled", "scrolled.drawn")):
        wide, builtin = (statistics.median(map(attrgetter(field), loads)) for loads in taken.values())
        ratios.append(f"{label} {wide / builtin:.2f}" if builtin else f"{label} -")
    print(f"  {' / '.join(taken)}: " + ", ".join(ratios))


def report_live(pairs: dict[str, list[tuple[Window, Window]]], args: argparse.Namespace, writers: list[Writer]) -> None:
    """Each run's cost of an open page (with the windows' other figures), and wide / built-in."""
    print(f"live pages, {args.pairs} pairs of {args.seconds:.0f} s with a page open and without, per run: "
          "median (lowest-highest)")  # fmt: skip
    costs = {}
    for name, windows in pairs.items():
        costs[name] = [1e3 * (page.server - idle.server) for page, idle in windows]
        print(f"  {name}: an open page costs the server {spread(costs[name], 1)} ms of CPU a second")
        print(f"    the server without a page: {spread([1e3 * idle.server for _page, idle in windows])} ms a second")
        loads = [1e3 * (page.load_s - idle.server * page.load_wall_s) for page, idle in windows]
        print(f"    the page's load: {spread(loads)} ms of the server's CPU more")
        print(f"    Chromium: {spread([1e3 * page.browser for page, _idle in windows])} ms of CPU a second with the "
              f"page open, {spread([1e3 * idle.browser for _page, idle in windows])} without")  # fmt: skip
        print(
            f"    the page drew {spread([page.points / args.seconds for page, _idle in windows])} points a second more"
        )
    wide, builtin = (statistics.median(values) for values in costs.values())
    print(f"  {' / '.join(costs)}, the server's CPU per open page: {wide / builtin:.2f}")
    failed = [failure for writer in writers for failure in writer.failed]
    print(f"  writers: {sum(writer.posted for writer in writers):,} batches posted, {len(failed)} failed"
          + (f" (first: {failed[0]})" if failed else ""))  # fmt: skip


def stored_pages(browser: Browser, args: argparse.Namespace) -> None:
    """The loads of the stored runs' pages, served from the cached store."""
    store = cached_store(args)
    with tempfile.TemporaryDirectory() as root:
        server = Server(Path(root), RANKBOARD_DATABASE_URL=f"sqlite:///{store}")
        try:
            with server_db(server.live) as db:
                runs = {run.name: run.id for run in db.scalars(select(Run).order_by(Run.id))}
            taken = page_loads(browser, server, runs, args.loads)
        finally:
            server.live.stop()
    report_loads(taken)


def live_pages(browser: Browser, args: argparse.Namespace) -> None:
    """The live runs, their writers, and the windows with their pages open and without."""
    with tempfile.TemporaryDirectory() as root:
        server, writers = Server(Path(root)), []
        try:
            runs = {"wide": open_run(server.live, TOKEN), "built-in": open_run(server.live, TOKEN)}
            posts = [wide_posts(key_names(args.keys), args.ranks, args.steps_per_post),
                     builtin_posts(args.ranks, args.steps_per_post)]  # fmt: skip
            for run_id, made in zip(runs.values(), posts, strict=True):
                writers.append(Writer(server.live.port, run_id, made))
                writers[-1].start()
            time.sleep(WARM_UP_S)
            pairs = live_pairs(browser, server, runs, args)
        finally:
            for writer in writers:
                writer.stopping.set()
                writer.join()
            server.live.stop()
    report_live(pairs, args, writers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200, help="keys of the wide run")
    parser.add_argument("--ranks", type=int, default=4, help="ranks reporting each key")
    parser.add_argument("--steps", type=int, default=100_000, help="steps of the stored runs")
    parser.add_argument("--loads", type=int, default=7, help="loads of each stored run's page")
    parser.add_argument("--pairs", type=int, default=3, help="pairs of live windows per run")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of a live window")
    parser.add_argument("--steps-per-post", type=int, default=10, help="steps in a live rank's batch of a second")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/rankboard-bench"), help="where the store is kept")
    parser.add_argument("--rebuild", action="store_true", help="build the store again though it is cached")
    parser.add_argument("--only", choices=("loads", "live"), help="measure only this part")
    args = parser.parse_args()
    if min(args.keys, args.ranks, args.steps, args.loads, args.pairs, args.steps_per_post) < 1 or args.seconds <= 0:
        parser.error("every count must be at least 1, and --seconds above 0")
    if args.steps_per_post > MAX_STEPS_PER_POST:
        parser.error(f"--steps-per-post must be at most {MAX_STEPS_PER_POST}")
    with chromium() as browser:
        if args.only != "live":
            stored_pages(browser, args)
        if args.only != "loads":
            live_pages(browser, args)


if __name__ == "__main__":
    main()
