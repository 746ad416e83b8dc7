"""In a real headless Chromium: the run page's charts, fed by the real client and GPU sampler (over the fake NVML,
the only stand-in: CI has no GPU) through the real server. A loss spike survives downsampling, every GPU of both
nodes gets its line and keeps gaining points while the page is open, and a node without NVML says so."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect
from rankboard import gpu
from rankboard.report import Reporter

from app.store import metrics as metric_store
from tests.live import LiveServer, open_run, points, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

TOKEN = "charts-token"
GIB = 2**30
STEPS = 3000
SPIKE_STEP, SPIKE = 1234, 50.0
NODES = {"node-a": 0, "node-b": 2}  # host: the global rank of its local rank 0, which samples its GPUs


def two_gpus() -> dict[str, Any]:
    return {"gpus": [
        {"uuid": f"GPU-{i}bbb-fake", "name": "NVIDIA H100 80GB HBM3", "util": [20, 70, 95],
         "memory_used": (i + 1) * 10 * GIB, "memory_total": 80 * GIB, "temp": 40 + i, "power": 250_000,
         "power_limit": 700_000, "sm_clock": 1980, "processes": []}
        for i in range(2)
    ]}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("charts")
    fake = root / "nvml.json"
    fake.write_text(json.dumps(two_gpus()))
    server = LiveServer(root / "server", RANKBOARD_FAKE_NVML=str(fake), RANKBOARD_SUPERVISE_INTERVAL_S="3600")
    server.start()
    yield server
    server.stop()


def reporter(server: LiveServer, run_id: int, spool: Path, rank: int) -> Reporter:
    return Reporter(server.url, str(run_id), TOKEN, spool, rank=rank, flush_interval=0.05)  # type: ignore[arg-type]


def loss(step: int) -> float:
    return SPIKE if step == SPIKE_STEP else 2.0 / math.sqrt(step)


def stored(server: LiveServer, run_id: int, key: str) -> int:
    with server.api() as api:
        return len(points(api, run_id, key, limit=10_000))


def drawn(page: Page, chart: str) -> dict[str, str]:
    """What the page says it drew on a chart: points, lines, max and labels, from the figure's data attributes."""
    return page.eval_on_selector(f"#{chart}-box", "el => ({...el.dataset})")  # type: ignore[no-any-return]


def test_loss_spike_and_every_gpu_of_both_nodes_are_drawn_and_grow_live(
    server: LiveServer, page: Page, tmp_path: Path
) -> None:
    run_id = open_run(server, TOKEN)
    fake = {gpu.ENV_FAKE_NVML: str(server.env["RANKBOARD_FAKE_NVML"])}
    reporters = {host: reporter(server, run_id, tmp_path / host, rank) for host, rank in NODES.items()}
    for step in range(1, STEPS + 1):
        reporters["node-a"].log({"loss": loss(step)}, step=step)
    samplers = [gpu.GpuSampler(reporters[host], host=host, environ=fake).start() for host in NODES]
    try:
        wait_for(lambda: stored(server, run_id, "loss") == STEPS, 30, what="every loss point")
        wait_for(lambda: all(stored(server, run_id, f"gpu/{h}/1/util") >= 3 for h in NODES), 30, what="GPU samples")

        page.goto(f"{server.url}/runs/{run_id}")
        page.wait_for_function("() => Number(document.querySelector('#loss-box')?.dataset.points || 0) > 0")
        loss_chart = drawn(page, "loss")
        assert float(loss_chart["max"]) == SPIKE  # one step in 3,000, yet drawn at full zoom-out
        assert int(loss_chart["points"]) < STEPS  # downsampled to the chart's width, not every point
        expect(page.locator("#loss-chart canvas")).to_have_count(1)

        gpus = ["node-a GPU 0", "node-a GPU 1", "node-b GPU 0", "node-b GPU 1"]
        page.wait_for_function("() => document.querySelector('#gpu-util-box')?.dataset.lines === '4'")
        assert json.loads(drawn(page, "gpu-util")["labels"]) == gpus
        assert "node-b GPU 1 mem total" in json.loads(drawn(page, "gpu-memory")["labels"])
        seen = int(drawn(page, "gpu-util")["points"])
        assert seen >= 3  # the samples stored before the page opened, each second its own point (not one bucket)
        page.wait_for_function(  # new samples arrive over the stream, without a reload
            f"() => Number(document.querySelector('#gpu-util-box').dataset.points) >= {seen + 3}", timeout=30_000
        )
        assert float(drawn(page, "gpu-util")["max"]) == 95.0
    finally:
        for sampler in samplers:
            sampler.stop()
        for client in reporters.values():
            client.close()
    page.screenshot(path=str(server.root / "charts.png"), full_page=True)


def test_a_node_without_nvml_says_so_and_shows_its_cpu(server: LiveServer, page: Page, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN)
    client = reporter(server, run_id, tmp_path, 0)
    missing = tmp_path / "no-nvml.json"
    missing.write_text(json.dumps({"library": "missing"}))
    sampler = gpu.GpuSampler(client, host="cpu-node", environ={gpu.ENV_FAKE_NVML: str(missing)}).start()
    try:
        wait_for(lambda: stored(server, run_id, "sys/cpu-node/cpu_percent"), 30, what="CPU samples")
        page.goto(f"{server.url}/runs/{run_id}")
        expect(page.get_by_text("No NVIDIA GPU found on cpu-node")).to_be_visible()
        expect(page.locator("#cpu-chart canvas")).to_have_count(1)
        expect(page.locator("#gpu-util-box")).to_have_count(0)
    finally:
        sampler.stop()
        client.close()


def test_a_page_that_was_away_while_the_live_log_moved_on_reads_its_charts_again(page: Page, tmp_path: Path) -> None:
    """The page's stream is cut (the server restarts) and cannot reconnect while its run logs a spike and another
    run logs more points than the live log keeps; back, the page is told it missed points, and shows the spike."""
    server = LiveServer(tmp_path / "server", RANKBOARD_SUPERVISE_INTERVAL_S="3600")
    server.start()
    try:
        run_id, other = open_run(server, TOKEN), open_run(server, TOKEN)
        watched = reporter(server, run_id, tmp_path / "watched", 0)
        for step in range(1, 101):
            watched.log({"loss": 1.0}, step=step)
        watched.close()
        page.goto(f"{server.url}/runs/{run_id}")
        page.wait_for_function("() => document.querySelector('#loss-box')?.dataset.points === '100'")

        page.route("**/stream*", lambda route: route.abort())  # away: every reconnection fails
        server.stop()
        server.start()
        spiked = reporter(server, run_id, tmp_path / "spiked", 0)
        spiked.log({"loss": SPIKE}, step=101)
        spiked.close()
        busy = Reporter(server.url, str(other), TOKEN, tmp_path / "busy", max_batch=10_000)
        for step in range(metric_store.RECENT_POINTS + 10_000):  # pushes step 101 out of the live log
            busy.log({"loss": 1.0}, step=step)
        busy.close(timeout=120)
        page.unroute("**/stream*")

        page.wait_for_function(f"() => Number(document.querySelector('#loss-box')?.dataset.max) === {SPIKE}",
                               timeout=60_000)  # fmt: skip
        assert drawn(page, "loss")["points"] == "101"
    finally:
        server.stop()
