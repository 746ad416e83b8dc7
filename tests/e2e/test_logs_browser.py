"""In headless Chromium: a real run's rank logs grow on the page, the rank selector and the filter change what is
shown, and a failure found in a rank's log is explained above it."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.test_run_lifecycle import FINAL, create, wait_status
from tests.live import LiveServer

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

# As torch 2.13 writes an uncaught exception once init_process_group ran: "[rank<n>]: " before each line.
TRACEBACK = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/data/train.py", line 42, in <module>
[rank1]:     batch = next(loader)
[rank1]: ValueError: bad batch shape (3, 4)
"""
# What rank 0 then writes (gloo's words, from a real torchrun run of torch 2.13): a consequence of rank 1's death.
LOST_PEER = """[rank0]: Traceback (most recent call last):
[rank0]:   File "/data/train.py", line 57, in <module>
[rank0]:     dist.barrier()
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by \
peer [127.0.0.1]:15077. This is typically caused by a remote worker crashing. Check the logs of the remote worker \
before reporting an error. GLHF!
"""


def shown(page: Page) -> int:
    return int(page.locator("#log-lines").get_attribute("data-lines") or 0)


def test_follow_a_ranks_log_live_switch_rank_filter_and_read_what_went_wrong(
    live_server: LiveServer, page: Page
) -> None:
    with live_server.api() as api:
        run = create(api, epochs=500, batch_size=256, keep_last=2, name="logs")
        page.goto(f"{live_server.url}/runs/{run['id']}")
        expect(page.locator("#status")).to_have_text("running", timeout=60_000)

        # Rank 0's stdout (the default) grows while the page is open: a "saved" line for every epoch's checkpoint.
        lines = page.locator("#log-lines")
        expect(lines).to_contain_text("[rank 0] started", timeout=60_000)
        expect(lines).to_contain_text("[rank 0] saved", timeout=60_000)
        seen = shown(page)
        page.wait_for_function(
            f"() => Number(document.querySelector('#log-lines').dataset.lines) > {seen}", timeout=60_000
        )
        expect(page.locator("#log-status")).to_have_attribute("data-state", "live")

        page.locator("#log-filter").fill("SAVED")  # case-insensitive, applied by the server to the tail and new lines
        expect(lines).not_to_contain_text("started", timeout=10_000)
        expect(lines.locator("div").first).to_contain_text("saved")
        expect(page.locator("#log-status")).to_contain_text("matching")
        page.locator("#log-filter").fill("")

        page.locator("#log-rank").select_option("1")
        expect(lines).to_contain_text("[rank 1] started", timeout=10_000)
        expect(lines).not_to_contain_text("[rank 0]")
        expect(page.locator("#log-download")).to_have_attribute("href", f"/api/runs/{run['id']}/logs/1/stdout/download")

        api.post(f"/api/runs/{run['id']}/stop")
        assert wait_status(api, run["id"], FINAL, timeout=120)["status"] == "stopped"
        expect(page.locator("#log-status")).to_have_attribute("data-state", "ended", timeout=30_000)
        expect(page.locator(".explain")).to_have_count(0)  # stopped on request: nothing went wrong

    # A failure written into rank 1's stderr is recognised, explained, and its log is one click away; rank 0's lost
    # peer, though its log changed first, is listed after it.
    attempt = next(Path(live_server.root, "shared", "logs", f"run-{run['id']}", "ranks").glob("*/attempt_*"))
    for rank, text in ((0, LOST_PEER), (1, TRACEBACK)):
        with open(attempt / str(rank) / "stderr.log", "a") as f:
            f.write(text)
    page.reload()
    explain = page.locator(".explain")
    expect(explain).to_contain_text("What went wrong")
    expect(explain.locator(".diagnosis").first).to_contain_text("ValueError: bad batch shape (3, 4)")
    expect(explain.locator(".diagnosis").nth(1)).to_have_attribute("data-kind", "peer_lost")
    expect(page.locator("#log-rank")).to_have_value("1")  # the panel opens on the rank that failed
    expect(page.locator("#log-stream")).to_have_value("stderr")
    expect(lines).to_contain_text("batch = next(loader)")
    page.locator("#log-rank").select_option("0")
    expect(lines).not_to_contain_text("bad batch shape")
    explain.get_by_role("button", name="Show rank 1's stderr").click()
    expect(lines).to_contain_text("ValueError: bad batch shape (3, 4)")
    page.screenshot(path=str(live_server.root / "logs-panel.png"), full_page=True)
