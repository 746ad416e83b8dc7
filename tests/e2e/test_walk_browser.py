"""In a real headless Chromium against a real server: every page, with runs in every state a user meets, opened and
left open a couple of seconds so its htmx refresh and its event streams run. Any console error, uncaught exception,
failed request or answer >= 400 to what the page asked for fails the walk, naming the page."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, Response, expect

from app.core.db import make_engine, make_sessionmaker
from tests.live import LiveServer, serving, wait_for
from tests.run_states import STATES, Seeded, seed_states, supervisor_has_seen

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

SHOTS = Path("/tmp/walk-shots")
LIVE_S = 2.2  # a live page's refresh runs every 2 s: look at each through one of them
STILL_S = 0.5  # a page without refresh or stream: its scripts have run once it loaded


@dataclass
class Walk:
    server: LiveServer
    sessions: Any
    seeded: dict[str, Seeded] = field(default_factory=dict)


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    root = tmp_path_factory.mktemp("walk")
    # 2 slots, both held by the live runs, so nothing queued is launched; no stop reaches its grace; the running
    # runs' fresh heartbeats stay fresh for the whole walk while the not-progressing run's are half an hour old.
    # serving kills any run's processes afterwards: none should have started, the walk's runs are this process.
    with serving(root, RANKBOARD_SLOTS="2", RANKBOARD_STOP_GRACE_S="3600", RANKBOARD_STALL_AFTER_S="600") as server:
        engine = make_engine(f"sqlite:///{root / 'data' / 'rankboard.db'}")
        try:
            yield Walk(server, make_sessionmaker(engine))
        finally:
            engine.dispose()


def look(page: Page, url: str, shows: str, shot: str | None = None, stay: float = LIVE_S) -> None:
    """Opens `url`, checks that it `shows` that text, leaves it open `stay` seconds, and fails on anything that went
    wrong meanwhile."""
    problems: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"console error: {message.text} at {message.location}")

    def failed(request: Request) -> None:
        if request.failure == "net::ERR_ABORTED" and request.headers.get("accept") == "text/event-stream":
            return  # the page closed a stream whose server said it ended (an EventSource would reconnect)
        problems.append(f"request failed: {request.method} {request.url}: {request.failure}")

    def answered(response: Response) -> None:
        if response.status >= 400:
            problems.append(f"{response.status} for {response.request.method} {response.url}")

    def crashed(error: Exception) -> None:
        problems.append(f"uncaught: {error}")

    handlers: list[tuple[str, Any]] = [("console", console), ("requestfailed", failed), ("response", answered),
                                       ("pageerror", crashed)]  # fmt: skip
    for event, handler in handlers:
        page.on(event, handler)
    try:
        answer = page.goto(url)
        assert answer is not None and answer.status == 200, f"{url}: {answer and answer.status}"
        expect(page.get_by_text(shows).first).to_be_visible()
        page.wait_for_timeout(stay * 1000)
        expect(page.get_by_text(shows).first).to_be_visible()  # still, after its refresh and its streams
        if shot:
            SHOTS.mkdir(exist_ok=True)
            page.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)
    finally:
        for event, handler in handlers:
            page.remove_listener(event, handler)
        page.goto("about:blank")  # closes its streams here, not during the next page's look
    assert not problems, f"{url}:\n" + "\n".join(problems)


def test_every_page_with_no_run_one_run_and_a_run_in_every_state(walk: Walk, browser: Browser) -> None:
    server = walk.server
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        look(page, server.url, "No runs yet")
        look(page, server.url + "/host", "Memory")
        for url, shows in (("/runs/new", "Start run"), ("/files", "Shared storage"), ("/docs", "runs")):
            look(page, server.url + url, shows, stay=STILL_S)

        with server.api() as api:
            walk.seeded = seed_states(api, walk.sessions, server.root / "shared", states=("running",))
            look(page, server.url, "walk running")
            others = [state for state in STATES if state != "running"]
            walk.seeded |= seed_states(api, walk.sessions, server.root / "shared", states=others)
            wait_for(lambda: supervisor_has_seen(api, walk.seeded), timeout=30, what="the supervisor's events")

        seeded = walk.seeded
        look(page, server.url, "walk not progressing", shot="runs-list")
        look(page, f"{server.url}/?status=failed", "walk failed")
        shots = {"running": "run-running", "failed": "run-failed", "not progressing": "run-not-progressing"}
        for state, run in seeded.items():
            look(page, f"{server.url}/runs/{run.id}", run.says, shot=shots.get(state))
        done = seeded["succeeded"]
        assert done.checkpoint and done.checkpoint_path
        look(page, f"{server.url}/runs/new?from_run={done.id}&init_from={done.checkpoint_path}", "Start run",
             stay=STILL_S)  # fmt: skip
        look(page, f"{server.url}/files?path=checkpoints/run-{done.id}", done.checkpoint, stay=STILL_S)
        look(page, f"{server.url}/files/inspect?path={done.checkpoint_path}", "model.weight", stay=STILL_S)
        look(page, f"{server.url}/?q=walk&filter=loss.min+<+1&columns=lr,loss.last&sort=-loss.min", "walk failed",
             shot="runs-table")  # fmt: skip
        compared = "&".join(f"run={seeded[state].id}" for state in ("running", "failed", "succeeded", "queued"))
        look(page, f"{server.url}/compare?{compared}", "walk succeeded", shot="compare")
        for state in ("running", "succeeded"):
            look(page, f"{server.url}/runs/{seeded[state].id}/delete", seeded[state].name, stay=STILL_S)
    finally:
        context.close()


def test_chart_axes_read_as_a_person_reads_them(walk: Walk, page: Page) -> None:
    """What the walk's screenshots showed: a learning-rate axis of 0.002, 0.0015, 0.001, 5.00e-4; GPUs at 97% on an
    axis up to 150%. (uPlot draws its axes on a canvas: the page's own functions are asked instead.)"""
    page.goto(walk.server.url + "/runs/new")
    read = page.evaluate("""async () => {
        const chart = await import("/static/charts/chart.js");
        return {lr: [0.002, 0.0015, 0.001, 0.0005, 0].map((v) => chart.formatValue("", v)),
                tiny: chart.formatValue("", 0.00003), util: chart.yScale("%").range(null, 97, 97),
                over: chart.yScale("%").range(null, 20, 120), loss: chart.yScale("").range}; }""")
    assert read["lr"] == ["0.002", "0.0015", "0.001", "0.0005", "0"] and read["tiny"] == "3e-5"
    assert read["util"] == [0, 100] and read["over"] == [0, 120] and read.get("loss") is None
