"""In a real headless Chromium: start a run from the form, watch its chart fill, stop it."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.live import LiveServer, run_processes

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def chart_points(page: Page) -> int:
    return int(page.locator("#chart-summary").get_attribute("data-points") or 0)


def test_start_a_run_from_the_form_watch_the_chart_grow_and_stop_it(live_server: LiveServer, page: Page) -> None:
    page.goto(live_server.url)
    expect(page.get_by_text("No runs yet")).to_be_visible()
    page.get_by_role("link", name="New run").first.click()

    page.get_by_label("Name").fill("from the browser")
    page.get_by_label("Epochs").fill("0")
    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#e-epochs")).to_contain_text("greater than or equal to 1")  # explained at the field

    page.get_by_label("Epochs").fill("500")
    page.get_by_role("button", name="Start run").click()
    expect(page.get_by_role("heading", name="from the browser")).to_be_visible()
    expect(page.locator("#status")).to_have_text("running", timeout=60_000)

    # The chart receives points while the run goes on, without a reload: read from the page itself.
    # The loss chart appears with the first loss point (charts are shown only for keys the run has).
    page.wait_for_function("() => Number(document.querySelector('#chart-summary')?.dataset.points || 0) > 10",
                           timeout=60_000)  # fmt: skip
    seen = chart_points(page)
    page.wait_for_function(f"() => Number(document.querySelector('#chart-summary').dataset.points) > {seen}",
                           timeout=30_000)  # fmt: skip
    expect(page.locator("#loss-chart canvas")).to_have_count(1)
    # Each rank's output is read in the one logs panel (issue 38 merged "Output of each rank" into it).
    expect(page.locator("#log-rank option", has_text="rank 1")).to_have_count(1)
    expect(page.locator("#log-lines")).to_contain_text("[rank 0]")

    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#status")).to_have_text("stopped", timeout=60_000)
    expect(page.locator("table.checkpoints")).to_contain_text("step-")
    page.screenshot(path=str(live_server.root / "run-page.png"), full_page=True)
    assert run_processes(live_server.root) == []
