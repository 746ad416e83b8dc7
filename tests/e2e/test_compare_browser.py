"""The compare page in a real headless Chromium against a real server, fed by the real client from two ranks of two
runs: every rank of each run drawn in that run's colour, the rank modes and smoothing of the run page, the view (and
the options toggle) back from the URL, the charts of a run still going read again (only those in view, only that
run's), and a chart's CSV holding both runs' points."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect
from rankboard.report import Reporter

from app.core.models import RunStatus
from tests.live import LiveServer, open_run, points, set_run, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

TOKEN = "compare-token"
STEPS, RANKS = 30, 2
SHOTS = Path("/tmp/compare-shots")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path_factory.mktemp("compare"), RANKBOARD_SUPERVISE_INTERVAL_S="3600")
    server.start()
    yield server
    server.stop()


def log_run(server: LiveServer, run_id: int, spool: Path, own_key: str, scale: float) -> None:
    """What a 2-rank script logs through the real client: a loss and `train/loss` on each rank, one key of its own
    from rank 0; each rank's client posts its own batches, as each process would."""
    clients = [Reporter(server.url, str(run_id), TOKEN, spool / f"rank{rank}", rank=rank, flush_interval=0.05)  # type: ignore[arg-type]
               for rank in range(RANKS)]  # fmt: skip
    try:
        for step in range(1, STEPS + 1):
            for rank, client in enumerate(clients):
                mine = {"loss": scale * math.exp(-step / 10) + 0.1 * rank, "train/loss": scale / step + rank}
                client.log(mine | ({own_key: step * scale} if rank == 0 else {}), step=step)
    finally:
        for client in clients:
            client.close()


@pytest.fixture(scope="module")
def runs(server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """Run "done" (finished, with `only_a/x`) and run "going" (still running, with `only_b/y`)."""
    made = {"done": open_run(server, TOKEN), "going": open_run(server, TOKEN)}
    spool = tmp_path_factory.mktemp("spools")
    for (name, run_id), (own, scale) in zip(made.items(), [("only_a/x", 3.0), ("only_b/y", 5.0)], strict=True):
        set_run(server, run_id, name=name)
        log_run(server, run_id, spool / name, own, scale)
    with server.api() as api:
        wait_for(lambda: all(len(points(api, r, "train/loss")) == STEPS * RANKS for r in made.values()), 30,
                 what="every rank's points")  # fmt: skip
    set_run(server, made["done"], status=RunStatus.succeeded)
    return made


def drawn(page: Page, chart: str) -> dict[str, str]:
    """What the page says it drew on a chart: points, lines, labels and its view, from the figure's attributes."""
    return page.eval_on_selector(f"#{chart}-box", "el => ({...el.dataset})")  # type: ignore[no-any-return]


def labels(page: Page, chart: str) -> list[str]:
    return json.loads(drawn(page, chart)["labels"])  # type: ignore[no-any-return]


def figure(key: str) -> str:
    return f"figure[data-keys='{json.dumps([key])}']"


def watch_errors(page: Page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def open_compare(page: Page, server: LiveServer, runs: dict[str, int], query: str = "") -> None:
    page.goto(f"{server.url}/compare?run={runs['done']}&run={runs['going']}{query}")
    page.wait_for_function("() => document.querySelector('#loss-box')?.dataset.points")


def test_every_rank_of_both_runs_in_their_colours_and_the_view_comes_back_from_its_url(
    server: LiveServer, runs: dict[str, int], page: Page
) -> None:
    done, going = runs["done"], runs["going"]
    errors = watch_errors(page)
    open_compare(page, server, runs)
    page.wait_for_function("() => document.querySelector('#loss-box').dataset.lines === '4'")
    assert labels(page, "loss") == [f"#{done} rank 0", f"#{done} rank 1", f"#{going} rank 0", f"#{going} rank 1"]
    swatch = "e => getComputedStyle(e).borderTopColor"
    lines = page.eval_on_selector_all("#loss-box .chart-legend .swatch", f"els => els.map({swatch})")
    colors = {
        run: page.eval_on_selector(f"#compare-runs li[data-run='{run}'] .swatch", swatch) for run in runs.values()
    }
    assert len(set(colors.values())) == 2 and len(set(lines)) == 4  # a colour per run, a shade per rank
    assert lines[0] == colors[done] and lines[2] == colors[going]  # rank 0 in the run's own colour

    sections = page.locator("details.chart-section:not([hidden])").evaluate_all("ds => ds.map(d => d.dataset.section)")
    assert sections == ["", "only_a", "only_b", "train"]  # the run page's sections, for every key of either run
    expect(page.locator(figure("only_b/y")).locator(".chart-lacking")).to_have_text(f"Not reported by #{done} done")

    options = page.locator("#compare-options tbody tr")
    differing = options.filter(visible=True).count()
    assert 0 < differing < options.count()  # a long table: only the options that differ
    page.uncheck("#only-differing")
    expect(options.filter(visible=True)).to_have_count(options.count())

    toolbar = page.locator("#chart-toolbar")
    toolbar.locator("select[name=ranks]").select_option("rank0")
    page.wait_for_function("() => document.querySelector('#loss-box').dataset.lines === '2'")
    assert labels(page, "loss") == [f"#{done} rank 0", f"#{going} rank 0"]
    toolbar.locator("select[name=ranks]").select_option("mean")
    page.wait_for_function("() => document.querySelector('#loss-box').dataset.ranks === 'mean'")
    assert labels(page, "loss") == [f"#{run} mean of 2 ranks (band: min to max)" for run in (done, going)]
    toolbar.locator("input[name=smoothing]").evaluate(
        "(el) => { el.value = '0.6'; el.dispatchEvent(new Event('input')); }"
    )
    toolbar.locator("select[name=x]").select_option("rel")
    wanted = {"x": "rel", "smoothing": "0.6", "ranks": "mean", "lines": "2"}
    # Each change redraws on its own: the x axis' can land after the smoothing's (CI saw it), so wait for both.
    page.wait_for_function(
        "() => (d => d.smoothing === '0.6' && d.x === 'rel')(document.querySelector('#loss-box').dataset)"
    )
    assert {name: drawn(page, "loss")[name] for name in wanted} == wanted
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / "compare-mean.png"), full_page=True)
    url = page.url
    assert all(part in url for part in ("ranks=mean", "smooth=0.6", "x=rel", "options=all", f"run={going}"))

    page.goto(url)  # a copied link: the same view
    page.locator("#loss-box").scroll_into_view_if_needed()  # below every option now: built as it comes into view
    page.wait_for_function("() => document.querySelector('#loss-box')?.dataset.points")
    assert {name: drawn(page, "loss")[name] for name in wanted} == wanted
    assert toolbar.locator("select[name=ranks]").input_value() == "mean"
    assert not page.is_checked("#only-differing") and options.filter(visible=True).count() == options.count()

    page.emulate_media(color_scheme="dark")  # the system turns dark: the charts and the key take the dark palette
    page.wait_for_function("() => document.documentElement.dataset.theme === 'dark'")
    page.wait_for_function(f"() => getComputedStyle(document.querySelector('#loss-box .chart-legend .swatch'))"
                           f".borderTopColor !== '{lines[0]}'")  # fmt: skip
    dark = page.eval_on_selector_all("#loss-box .chart-legend .swatch", f"els => els.map({swatch})")
    assert dark[0] == page.eval_on_selector(f"#compare-runs li[data-run='{done}'] .swatch", swatch) != colors[done]
    page.screenshot(path=str(SHOTS / "compare-dark.png"), full_page=True)
    assert errors == []


def test_a_run_still_going_is_read_again_only_in_the_charts_in_view(
    server: LiveServer, runs: dict[str, int], page: Page
) -> None:
    errors = watch_errors(page)
    page.set_viewport_size({"width": 1280, "height": 700})  # some charts below the fold
    open_compare(page, server, runs, "&options=differ")
    page.locator("#loss-box").scroll_into_view_if_needed()
    in_view = """() => [...document.querySelectorAll('figure[data-chart]')].filter((f) => {
        const r = f.getBoundingClientRect(); return r.height && r.bottom > 0 && r.top < innerHeight; })"""
    page.wait_for_function(f"() => ({in_view})().every((f) => f.dataset.points !== undefined)")
    seen = set(page.evaluate(f"() => ({in_view})().flatMap((f) => JSON.parse(f.dataset.keys))"))
    assert seen and "only_b/y" not in seen  # the page has charts out of view
    reads: list[tuple[int, str]] = []

    def sent(request: Any) -> None:
        if m := re.search(r"/api/runs/(\d+)/chart\?key=([^&]+)", request.url):
            reads.append((int(m[1]), m[2].replace("%2F", "/")))

    page.on("request", sent)
    page.wait_for_timeout(5_600)  # one interval of the live re-read
    assert reads and {run for run, _key in reads} == {runs["going"]}  # the finished run is not read again
    assert {key for _run, key in reads} <= seen  # nor the charts out of view
    page.screenshot(path=str(SHOTS / "compare-top.png"))
    assert errors == []


def test_a_compare_charts_csv_holds_both_runs_points_and_its_png_is_a_picture(
    server: LiveServer, runs: dict[str, int], page: Page
) -> None:
    open_compare(page, server, runs)
    chart = page.locator(figure("train/loss"))
    chart.scroll_into_view_if_needed()
    page.wait_for_function(f"() => document.querySelector(`{figure('train/loss')}`)?.dataset.lines === '4'")
    with page.expect_download() as download:
        chart.locator(".chart-csv").click()
    assert download.value.suggested_filename == f"compare-{runs['done']}-{runs['going']}-{chart_id(page)}.csv"
    rows = Path(download.value.path()).read_text().splitlines()
    assert rows[0] == "run,step,rank,value,time" and len(rows) == 1 + 2 * STEPS * RANKS
    with server.api() as api:
        for run_id in runs.values():
            mine = [tuple(map(float, row.split(",")[1:4])) for row in rows[1:] if row.startswith(f"{run_id},")]
            assert mine == [(p["step"], p["rank"], p["value"]) for p in points(api, run_id, "train/loss")]
    with page.expect_download() as download:
        chart.locator(".chart-png").click()
    png = Path(download.value.path()).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") >= 500


def chart_id(page: Page) -> str:
    return json.loads(page.get_attribute(figure("train/loss"), "data-chart") or "{}")["id"]  # type: ignore[no-any-return]
