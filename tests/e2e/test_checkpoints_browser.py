"""In headless Chromium: open a run's checkpoints, inspect one, start a new run from it."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.test_run_lifecycle import FINAL, create, wait_status
from tests.live import LiveServer

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def test_inspect_a_checkpoint_and_start_a_new_run_from_it(live_server: LiveServer, page: Page) -> None:
    with live_server.api() as api:
        run = create(api, epochs=2, batch_size=256, name="source")
        assert wait_status(api, run["id"], FINAL, timeout=180)["status"] == "succeeded"
    page.goto(f"{live_server.url}/runs/{run['id']}")
    rows = page.locator("table.checkpoints tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.last).to_contain_text("latest")

    rows.last.get_by_role("link", name="Inspect").click()
    expect(page.get_by_role("heading", name="Checkpoint")).to_be_visible()
    expect(page.locator("table.tensors")).to_contain_text("model.")
    expect(page.get_by_text("model parameters")).to_be_visible()

    page.go_back()
    page.locator("table.checkpoints tbody tr").last.get_by_role("link", name="New run from this").click()
    expect(page.get_by_label("Start from checkpoint")).to_have_value(f"checkpoints/run-{run['id']}/step-00000256.pt")
    page.get_by_label("Epochs").fill("1")
    page.get_by_role("button", name="Start run").click()
    expect(page.get_by_role("heading", name="source from step-00000256.pt")).to_be_visible()
    expect(page.locator("#status")).to_have_text("succeeded", timeout=120_000)
    expect(page.get_by_text("started from")).to_be_visible()
