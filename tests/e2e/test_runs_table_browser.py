"""The runs table in a real headless Chromium against a real server: filter it, select two runs, compare them, and
tag one, as a user does, with nothing going wrong in the page meanwhile."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.runs import finished_runs_with_loss
from tests.live import LiveServer

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
SHOTS = "/tmp/walk-shots"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("table"), RANKBOARD_SLOTS="2")
    live.start()
    yield live
    live.stop()


def test_filter_select_two_compare_them_and_tag_one(server: LiveServer, page: Page) -> None:
    ids = finished_runs_with_loss(server, {"wide": 0.9, "narrow": 0.2, "deep": 0.4, "shallow": 0.7})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(server.url)
    page.fill("#filter", "loss.min < 0.5")
    page.fill("#columns", "loss.min,lr")
    page.click("#runs-query button[type=submit]")
    expect(page).to_have_url(re.compile(r"filter=loss\.min"))
    names = page.locator("table.runs tbody tr td:nth-child(3) a")
    expect(names).to_have_text(["deep", "narrow"])  # newest first, only those under 0.5
    expect(page.locator("table.runs thead")).to_contain_text("loss.min")
    page.screenshot(path=f"{SHOTS}/runs-table-filtered.png", full_page=True)

    page.check(f"#select-{ids['deep']}")
    page.check(f"#select-{ids['narrow']}")
    page.wait_for_timeout(2300)  # the table refreshes itself every 2 s: the ticks must survive it
    expect(page.locator(f"#select-{ids['narrow']}")).to_be_checked()
    page.click("#bulk-compare")
    expect(page).to_have_url(re.compile(r"/compare\?run=\d+&run=\d+$"))
    expect(page.locator("h1")).to_have_text("Compare 2 runs")
    chart = page.locator("#compare-charts figure").first
    expect(chart).to_have_attribute("data-lines", "2")  # both runs' loss on the one chart
    page.screenshot(path=f"{SHOTS}/compare.png", full_page=True)

    page.go_back()
    page.uncheck(f"#select-{ids['deep']}")
    page.check(f"#select-{ids['narrow']}")
    page.fill("#bulk-tag", "winner")
    page.click("#bulk-tag-add")
    expect(page).to_have_url(re.compile(r"filter=loss\.min"))  # back to the same view
    row = page.locator("table.runs tbody tr", has_text="narrow")
    expect(row.locator("a.tag")).to_have_text("winner")
    expect(page.locator("table.runs tbody tr", has_text="deep").locator("a.tag")).to_have_count(0)
    assert not problems, problems
