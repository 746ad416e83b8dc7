"""In a real headless Chromium: the run page's charts, fed by the real client and GPU sampler (over the fake NVML,
the only stand-in: CI has no GPU) through the real server. A loss spike survives downsampling, every GPU of both
nodes gets its line and keeps gaining points while the page is open, and a node without NVML says so."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

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
        page.locator("#gpu-memory-box").scroll_into_view_if_needed()  # charts are built as they come into view
        page.wait_for_function("() => document.querySelector('#gpu-util-box')?.dataset.lines === '4'")
        page.wait_for_function("() => document.querySelector('#gpu-memory-box')?.dataset.labels")
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


RANKS = 4
MANY = 200
NESTED = ["a/b/c", "train/acc", "损失", "ünï/x"]


def log_a_script_run(server: LiveServer, run_id: int, tmp_path: Path, steps: range) -> None:
    """What a user's DDP script logs through the real client: a loss and `train/loss` on every rank, and nested,
    unicode and 200 other keys from rank 0; each rank's client posts its own batches, as each process would."""
    clients = [reporter(server, run_id, tmp_path / f"rank{rank}", rank) for rank in range(RANKS)]
    try:
        for step in steps:
            for rank, client in enumerate(clients):
                mine = {"loss": 12 * math.exp(-step / 8) + 0.01 * rank + 1e-3, "train/loss": 1 / step + rank}
                extra = {key: step * 0.5 for key in NESTED} | {
                    f"many/k{i:03d}": i + math.sin(step) for i in range(MANY)
                }
                client.log(mine | (extra if rank == 0 else {}), step=step)
    finally:
        for client in clients:
            client.close()


def in_flight_chart_reads(page: Page) -> dict[str, int]:
    """Counts the page's chart reads under way, and the most at once, as the browser sends them."""
    reads = {"now": 0, "most": 0, "all": 0}

    def sent(request: Any) -> None:
        if "/chart?" in request.url:
            reads["now"] += 1
            reads["all"] += 1
            reads["most"] = max(reads["most"], reads["now"])

    def ended(request: Any) -> None:
        if "/chart?" in request.url:
            reads["now"] -= 1

    page.on("request", sent)
    page.on("requestfinished", ended)
    page.on("requestfailed", ended)
    return reads


def figure(key: str) -> str:
    return f"figure[data-keys='{json.dumps([key], ensure_ascii=False)}']"


def built(page: Page) -> int:
    return int(page.evaluate("document.querySelectorAll('figure[data-built]').length"))


def scroll_through(page: Page) -> int:
    """Scrolls the page top to bottom a screen at a time; at each stop, waits for every chart in view to be drawn.
    Returns how many screens it took."""
    screens = 0
    in_view_drawn = """() => [...document.querySelectorAll('figure[data-chart]')].filter((f) => {
        const r = f.getBoundingClientRect(); return !f.hidden && r.height && r.bottom > 0 && r.top < innerHeight;
      }).every((f) => f.dataset.points !== undefined)"""
    while True:
        page.wait_for_function(in_view_drawn, timeout=20_000)
        screens += 1
        if page.evaluate("innerHeight + scrollY >= document.body.scrollHeight - 2"):
            return screens
        page.mouse.wheel(0, 800)
        page.wait_for_timeout(50)


def following(page: Page, holds: Callable[[], bool], what: str) -> None:
    """Waits up to 10 s for `holds`, letting the page run (Playwright hands its events over only while called)."""
    for _ in range(100):
        if holds():
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_page_of_200_charts_draws_them_as_they_scroll_into_view(
    server: LiveServer, page: Page, tmp_path: Path
) -> None:
    run_id = open_run(server, TOKEN)
    log_a_script_run(server, run_id, tmp_path, range(1, 41))
    wait_for(lambda: stored(server, run_id, f"many/k{MANY - 1:03d}") == 40, 60, what="the last key's points")
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    reads = in_flight_chart_reads(page)
    streams: list[str] = []  # the points' stream as the page opens it: following the charts it has built
    page.on("request", lambda request: streams.append(request.url) if "parts=points" in request.url else None)

    def watched() -> set[str]:
        return set(parse_qs(urlparse(streams[-1]).query).get("watch", [])) - {""} if streams else set()

    page.goto(f"{server.url}/runs/{run_id}")
    page.wait_for_function("() => document.querySelector('#loss-box')?.dataset.points === '40'")
    figures = page.locator("figure[data-chart]").count()
    assert figures == MANY + len(NESTED) + 2  # loss and train/loss, drawn per rank, besides
    assert built(page) < 20  # the charts near the top, not all of them
    following(page, lambda: "loss" in watched(), "the stream to follow the built charts")
    assert len(watched()) < 20  # not the points of 200 keys to every open page each second
    page.screenshot(path=str(server.root / "charts-200-top.png"))

    log_a_script_run(server, run_id, tmp_path / "later", range(41, 42))  # live, while the last chart is unbuilt
    wait_for(lambda: stored(server, run_id, f"many/k{MANY - 1:03d}") == 41, 30, what="step 41")
    page.wait_for_function("() => document.querySelector('#loss-box').dataset.points === '41'")  # live, streamed
    screens = scroll_through(page)
    assert screens > 10 and built(page) == figures  # each built as it came into view
    following(page, lambda: len(watched()) == MANY + len(NESTED) + 2, "the stream to follow every chart")
    assert reads["most"] <= 6 and reads["all"] >= figures  # never more than six reads at once
    assert page.get_attribute(figure(f"many/k{MANY - 1:03d}"), "data-points") == "41"  # read fresh when built
    assert errors == []
    page.screenshot(path=str(server.root / "charts-200-bottom.png"))


def test_each_rank_is_drawn_and_the_view_comes_back_from_its_url(
    server: LiveServer, page: Page, tmp_path: Path
) -> None:
    run_id = open_run(server, TOKEN)
    log_a_script_run(server, run_id, tmp_path, range(1, 31))
    wait_for(lambda: stored(server, run_id, f"many/k{MANY - 1:03d}") == 30, 60, what="every point")
    page.goto(f"{server.url}/runs/{run_id}")
    page.wait_for_function("() => document.querySelector('#loss-box')?.dataset.lines === '4'")
    assert json.loads(drawn(page, "loss")["labels"]) == [f"rank {rank}" for rank in range(RANKS)]

    toolbar = page.locator("#chart-toolbar")
    toolbar.locator("select[name=ranks]").select_option("mean")
    page.wait_for_function("() => document.querySelector('#loss-box').dataset.lines === '1'")
    assert json.loads(drawn(page, "loss")["labels"]) == ["mean of 4 ranks (band: min to max)"]
    toolbar.locator("input[name=logy]").check()
    toolbar.locator("select[name=x]").select_option("rel")
    toolbar.locator("input[name=smoothing]").evaluate(
        "(el) => { el.value = '0.6'; el.dispatchEvent(new Event('input')); }"
    )
    page.locator(figure("a/b/c")).locator(".chart-pin").click()
    page.locator("details[data-section='many'] > summary").click()
    wanted = {"log": "true", "x": "rel", "smoothing": "0.6", "ranks": "mean", "lines": "1"}
    page.wait_for_function("() => document.querySelector('#loss-box').dataset.smoothing === '0.6'")
    assert {name: drawn(page, "loss")[name] for name in wanted} == wanted
    url = page.url
    assert "logy=1" in url and "x=rel" in url and "smooth=0.6" in url and "ranks=mean" in url

    page.goto(url)  # a copied link: the same view
    page.wait_for_function("() => document.querySelector('#loss-box')?.dataset.points")
    assert {name: drawn(page, "loss")[name] for name in wanted} == wanted
    assert toolbar.locator("input[name=logy]").is_checked() and toolbar.locator("select[name=x]").input_value() == "rel"
    assert page.locator(figure("a/b/c")).evaluate("(f) => f.closest('details').dataset.sectionId") == "pinned"
    assert page.locator("details[data-section='many']").evaluate("(d) => d.open") is False
    page.screenshot(path=str(server.root / "charts-view.png"), full_page=True)


def test_a_charts_csv_holds_every_point_the_api_has_and_its_png_is_a_picture(
    server: LiveServer, page: Page, tmp_path: Path
) -> None:
    run_id = open_run(server, TOKEN)
    log_a_script_run(server, run_id, tmp_path, range(1, 26))
    wait_for(lambda: stored(server, run_id, "train/loss") == 25 * RANKS, 60, what="every rank's points")
    page.goto(f"{server.url}/runs/{run_id}")
    chart = page.locator(figure("train/loss"))
    chart.scroll_into_view_if_needed()
    page.wait_for_function(f"() => document.querySelector(`{figure('train/loss')}`)?.dataset.points === '25'")

    with page.expect_download() as download:
        chart.locator(".chart-csv").click()
    rows = Path(download.value.path()).read_text().splitlines()
    with server.api() as api:
        assert rows == api.get(f"/api/runs/{run_id}/metrics/train/loss", params={"format": "csv"}).text.splitlines()
        json_points = points(api, run_id, "train/loss")
    assert rows[0] == "step,rank,value,time" and len(rows) == 1 + 25 * RANKS
    assert [tuple(map(float, row.split(",")[:3])) for row in rows[1:]] == [
        (p["step"], p["rank"], p["value"]) for p in json_points
    ]  # every point of every rank, not the buckets drawn

    with page.expect_download() as download:
        chart.locator(".chart-png").click()
    png = Path(download.value.path()).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") >= 500  # width, in pixels
