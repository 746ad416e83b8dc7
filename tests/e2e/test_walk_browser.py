"""In a real headless Chromium against a real server: every page, with runs in every state a user meets, opened and
left open a couple of seconds so its htmx refresh and its event streams run. Any console error, uncaught exception,
failed request or answer >= 400 to what the page asked for fails the walk, naming the page.

Each open page is then seen as people see it: in the light and the dark theme (the system's setting switched under
it, which the page and its charts follow) and in a desktop window (1,400 px) and on a phone (360 px), a screenshot of
each kept under the test's temporary folder (`walk-shots*/`, named by page, theme and width); and in both themes
axe-core (static/vendor, the npm package's own build) checks the page: any serious or critical accessibility
violation, colour contrast below WCAG AA included, fails the walk, naming the page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, Response, expect

from app.core.db import make_engine, make_sessionmaker
from tests.live import LiveServer, serving, wait_for
from tests.run_states import STATES, Seeded, seed_states, supervisor_has_seen

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

LIVE_S = 2.2  # a live page's refresh runs every 2 s: look at each through one of them
STILL_S = 0.5  # a page without refresh or stream: its scripts have run once it loaded
THEMES: tuple[Literal["light", "dark"], ...] = ("light", "dark")
WIDTHS = (1400, 360)  # a desktop window, and a phone
AXE = "/static/vendor/axe-core-4.14.1.min.js"
REFUSED = ("serious", "critical")  # axe's impacts that fail the walk
# Markup that is a vendored library's, not ours: the API page is Swagger UI's own, whose nested controls in each
# operation's summary and its faint version stamp axe finds serious (swagger-api/swagger-ui#9576, #10697, open).
VENDOR_UI = '["#swagger-ui"]'


@dataclass
class Walk:
    server: LiveServer
    sessions: Any
    shots: Path  # where each page's screenshots are kept
    seeded: dict[str, Seeded] = field(default_factory=dict)


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    root = tmp_path_factory.mktemp("walk")
    shots = tmp_path_factory.mktemp("walk-shots")
    # 2 slots, both held by the live runs, so nothing queued is launched; no stop reaches its grace; the running
    # runs' fresh heartbeats stay fresh for the whole walk while the not-progressing run's are half an hour old.
    # serving kills any run's processes afterwards: none should have started, the walk's runs are this process.
    with serving(root, RANKBOARD_SLOTS="2", RANKBOARD_STOP_GRACE_S="3600", RANKBOARD_STALL_AFTER_S="600") as server:
        engine = make_engine(f"sqlite:///{root / 'data' / 'rankboard.db'}")
        try:
            yield Walk(server, make_sessionmaker(engine), shots)
        finally:
            engine.dispose()
            print(f"\nthe walk's screenshots: {shots}")


@contextmanager
def watching(page: Page, status: int = 200) -> Iterator[list[str]]:
    """What goes wrong on `page` meanwhile: console errors, uncaught exceptions, failed requests, answers >= 400 (but
    the page's own `status`, where the walk asks for a page that says what is wrong)."""
    problems: list[str] = []

    def console(message: ConsoleMessage) -> None:
        said = f"Failed to load resource: the server responded with a status of {status} "
        if message.type == "error" and status != 200 and message.text.startswith(said):
            return  # Chromium's word on the page's own status, the one the walk asked for
        if message.type == "error":
            problems.append(f"console error: {message.text} at {message.location}")

    navigations: list[Request] = []  # the page's, in the order they began
    made_after: dict[Request, int] = {}  # how many had begun when each request was made

    def requested(request: Request) -> None:
        if request.is_navigation_request() and request.frame == page.main_frame:
            navigations.append(request)
        made_after[request] = len(navigations)

    def failed(request: Request) -> None:
        if request.failure == "net::ERR_ABORTED" and request.headers.get("accept") == "text/event-stream":
            return  # the page closed a stream whose server said it ended (an EventSource would reconnect)
        if request.failure == "net::ERR_ABORTED" and made_after.get(request, len(navigations)) < len(navigations):
            return  # the page went elsewhere before it loaded (a favicon still coming at the next goto)
        problems.append(f"request failed: {request.method} {request.url}: {request.failure}")

    def answered(response: Response) -> None:
        if response.request.is_navigation_request() and response.status == status:
            return
        if response.status >= 400:
            problems.append(f"{response.status} for {response.request.method} {response.url}")

    def crashed(error: Exception) -> None:
        problems.append(f"uncaught: {error}")

    handlers: list[tuple[str, Any]] = [("console", console), ("request", requested), ("requestfailed", failed),
                                       ("response", answered), ("pageerror", crashed)]  # fmt: skip
    for event, handler in handlers:
        page.on(event, handler)
    try:
        yield problems
    finally:
        for event, handler in handlers:
            page.remove_listener(event, handler)
        page.goto("about:blank")  # closes its streams here, not during the next page's look


def look(page: Page, url: str, shows: str, shot: Path, stay: float = LIVE_S, status: int = 200) -> None:
    """Opens `url`, checks that it `shows` that text, leaves it open `stay` seconds, sees it as people do (`see`,
    into screenshots named `shot`), and fails on anything that went wrong meanwhile."""
    with watching(page, status) as problems:
        answer = page.goto(url)
        assert answer is not None and answer.status == status, f"{url}: {answer and answer.status}"
        expect(page.get_by_text(shows).first).to_be_visible()
        page.wait_for_timeout(stay * 1000)
        expect(page.get_by_text(shows).first).to_be_visible()  # still, after its refresh and its streams
        problems += see(page, shot)
    assert not problems, f"{url}:\n" + "\n".join(problems)


def see(page: Page, shot: Path) -> list[str]:
    """The open page in each theme (the system's setting switched under it: the page follows, its charts redrawn)
    and at each width, a screenshot of each (`<shot>-<theme>-<width>.png`); axe-core's serious and critical
    violations in each theme, at the desktop width."""
    found: list[str] = []
    scroll_through(page)
    for theme in THEMES:
        page.emulate_media(color_scheme=theme)
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_timeout(150)  # its charts take their new width, or the new theme's colours
            page.screenshot(path=f"{shot}-{theme}-{width}.png", full_page=True)
            if width == WIDTHS[0]:
                found += [f"{theme}: {violation}" for violation in accessibility_violations(page)]
    page.emulate_media(color_scheme=THEMES[0])
    page.set_viewport_size({"width": WIDTHS[0], "height": 900})
    return found


def scroll_through(page: Page) -> None:
    """Down a page of charts a screen at a time, so every lazily drawn chart is drawn, then back to the top."""
    if not page.locator("figure[data-chart]").count():
        return
    height = page.evaluate("document.documentElement.scrollHeight")
    for top in range(0, height, 800):
        page.evaluate(f"window.scrollTo(0, {top})")
        page.wait_for_timeout(60)
    page.wait_for_timeout(400)  # the charts' reads, then their drawing
    page.evaluate("window.scrollTo(0, 0)")


def accessibility_violations(page: Page) -> list[str]:
    """axe-core's serious and critical violations of the page (WCAG 2 A and AA, and its best practices), each with
    the elements it found them on."""
    if not page.evaluate("typeof axe !== 'undefined'"):
        page.add_script_tag(url=AXE)  # from the server: the pages' CSP allows only their own origin's scripts
    found = page.evaluate(f"async () => (await axe.run({{exclude: {VENDOR_UI}}}, {{resultTypes: ['violations']}}))"
                          ".violations"
                          ".map((v) => ({id: v.id, impact: v.impact, help: v.help,"
                          " nodes: v.nodes.slice(0, 3).map((n) => n.target.join(' '))}))")  # fmt: skip
    return [f"axe {v['impact']}: {v['id']} ({v['help']}) at {v['nodes']}" for v in found if v["impact"] in REFUSED]


def test_every_page_with_no_run_one_run_and_a_run_in_every_state(walk: Walk, browser: Browser) -> None:
    server, shots = walk.server, walk.shots
    context = browser.new_context(viewport={"width": WIDTHS[0], "height": 900}, color_scheme=THEMES[0])
    page = context.new_page()
    try:
        look(page, server.url, "No runs yet", shots / "runs-empty")
        look(page, server.url + "/host", "Memory", shots / "host")
        for url, shows, shot in (("/runs/new", "Start run", "new-run"), ("/files", "Shared storage", "files"),
                                 ("/docs", "runs", "docs")):  # fmt: skip
            look(page, server.url + url, shows, shots / shot, stay=STILL_S)
        with server.api() as api:
            walk.seeded = seed_states(api, walk.sessions, server.root / "shared", states=("running",))
            look(page, server.url, "walk running", shots / "runs-one")
            others = [state for state in STATES if state != "running"]
            walk.seeded |= seed_states(api, walk.sessions, server.root / "shared", states=others)
            wait_for(lambda: supervisor_has_seen(api, walk.seeded), timeout=30, what="the supervisor's events")
        every_page_of_the_runs(walk, page)
    finally:
        context.close()


def every_page_of_the_runs(walk: Walk, page: Page) -> None:
    """The pages of a store with a run in every state: the list, each run, and what the run pages link."""
    url, seeded, shots = walk.server.url, walk.seeded, walk.shots
    look(page, url, "walk not progressing", shots / "runs-list")
    look(page, f"{url}/?status=failed", "walk failed", shots / "runs-failed")
    for state, run in seeded.items():
        look(page, f"{url}/runs/{run.id}", run.says, shots / ("run-" + state.replace(" ", "-")))
    done = seeded["succeeded"]
    assert done.checkpoint and done.checkpoint_path
    look(page, f"{url}/runs/new?from_run={done.id}&init_from={done.checkpoint_path}", "Start run",
         shots / "new-run-from", stay=STILL_S)  # fmt: skip
    look(page, f"{url}/files?path=checkpoints/run-{done.id}", done.checkpoint, shots / "files-run", stay=STILL_S)
    look(page, f"{url}/files/inspect?path={done.checkpoint_path}", "model.weight", shots / "inspect", stay=STILL_S)
    look(page, f"{url}/?q=walk&filter=loss.min+<+1&columns=lr,loss.last&sort=-loss.min", "walk failed",
         shots / "runs-table")  # fmt: skip
    # A condition without its value: said at its box, as typed, over the table of every run (a 422, not an error page)
    look(page, f"{url}/?filter=loss+<", "has no value after", shots / "runs-bad-filter", status=422)
    compared = "&".join(f"run={seeded[state].id}" for state in ("running", "failed", "succeeded", "queued"))
    look(page, f"{url}/compare?{compared}", "walk succeeded", shots / "compare")
    look(page, f"{url}/usage?by=tag", "GPU-hours", shots / "usage", stay=STILL_S)
    for state in ("running", "succeeded"):
        run = seeded[state]
        look(page, f"{url}/runs/{run.id}/delete", run.name, shots / f"delete-{state}", stay=STILL_S)


def test_chart_axes_read_as_a_person_reads_them(walk: Walk, page: Page) -> None:
    """What the walk's screenshots showed: a learning-rate axis of 0.002, 0.0015, 0.001, 5.00e-4; GPUs at 97% on an
    axis up to 150%; tokens at 1.5e+4; wall-clock ticks at :14.000 :14.500. Now engineering units, and ticks at
    whole seconds or minutes. (uPlot draws its axes on a canvas: the page's own functions are asked instead.)"""
    page.goto(walk.server.url + "/runs/new")
    read = page.evaluate("""async () => {
        const chart = await import("/static/charts/chart.js");
        const at = new Date(2026, 10, 27, 6, 42, 14).getTime() / 1000;
        return {lr: [0.002, 0.0015, 0.001, 0.0005, 0].map((v) => chart.formatValue("", v)),
                tiny: chart.formatValue("", 0.00003), util: chart.yScale("%").range(null, 97, 97),
                over: chart.yScale("%").range(null, 20, 120), loss: chart.yScale("").range,
                big: [14400, 2.5e6, -3e9, 999].map((v) => chart.formatValue("", v)),
                units: [["ms", 3.2], ["ms", 1500], ["bytes", 1.5 * 2 ** 30], ["bytes", 512 * 2 ** 20], ["/s", 14400]]
                       .map(([unit, v]) => chart.formatValue(unit, v)),
                clock: [chart.formatClock(at, 1), chart.formatClock(at, 300), chart.formatClock(at, 86400)]}; }""")
    assert read["lr"] == ["0.002", "0.0015", "0.001", "0.0005", "0"] and read["tiny"] == "3e-5"
    assert read["util"] == [0, 100] and read["over"] == [0, 120] and read.get("loss") is None
    assert read["big"] == ["14.4k", "2.5M", "-3G", "999"]
    assert read["units"] == ["3.2 ms", "1.5 s", "1.5 GiB", "512 MiB", "14.4k"]
    assert read["clock"][:2] == ["06:42:14", "06:42"] and read["clock"][2] in ("Nov 27", "27 Nov")


def seeded(walk: Walk) -> dict[str, Seeded]:
    """The walk's runs in every state (seeded by the walk, or here when a test runs without it)."""
    if not walk.seeded:
        with walk.server.api() as api:
            walk.seeded = seed_states(api, walk.sessions, walk.server.root / "shared")
            wait_for(lambda: supervisor_has_seen(api, walk.seeded), timeout=30, what="the supervisor's events")
    return walk.seeded


# Records <html data-theme> and data-hide-columns as the first frame is painted: what the page looked like at once.
FIRST_FRAME = """requestAnimationFrame(() => { window.firstFrame = {theme: document.documentElement.dataset.theme,
                                                      hidden: document.documentElement.dataset.hideColumns}; });"""


def test_the_theme_follows_the_system_and_the_switch_kept_per_browser_charts_included(
    walk: Walk, browser: Browser
) -> None:
    run = seeded(walk)["running"]
    context = browser.new_context(viewport={"width": 1400, "height": 900}, color_scheme="light")
    context.add_init_script(FIRST_FRAME)
    page = context.new_page()
    try:
        with watching(page) as problems:
            page.goto(f"{walk.server.url}/runs/{run.id}")
            toggle = page.locator("#theme-toggle")
            expect(toggle).to_have_text("Theme: auto (light)")
            loss = page.locator("#loss-box .chart-legend .swatch").first
            expect(loss).to_have_css("border-top-color", "rgb(37, 99, 235)")  # --chart-1, light
            toggle.click()
            toggle.click()  # auto, light, dark
            expect(toggle).to_have_text("Theme: dark")
            assert page.evaluate("document.documentElement.dataset.theme") == "dark"
            expect(page.locator("body")).to_have_css("background-color", "rgb(15, 20, 27)")
            expect(loss).to_have_css("border-top-color", "rgb(96, 165, 250)")  # drawn again: --chart-1, dark
            page.reload()  # the choice is this browser's: dark from the first frame on, before the stylesheet
            assert page.evaluate("window.firstFrame.theme") == "dark"
            expect(toggle).to_have_text("Theme: dark")
            toggle.click()
            expect(toggle).to_have_text("Theme: auto (light)")  # back to the system's
        assert not problems, "\n".join(problems)
    finally:
        context.close()


def test_the_runs_list_shows_its_bulk_bar_once_a_run_is_ticked_sorts_by_header_and_keeps_hidden_columns(
    walk: Walk, browser: Browser
) -> None:
    runs = seeded(walk)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.add_init_script(FIRST_FRAME)
    page = context.new_page()
    try:
        with watching(page) as problems:
            page.goto(walk.server.url)
            bulk = page.locator("#bulk")
            expect(bulk).to_be_hidden()  # nothing ticked: no Delete on show
            page.check(f"#select-{runs['failed'].id}")
            expect(bulk).to_be_visible()
            page.uncheck(f"#select-{runs['failed'].id}")
            expect(bulk).to_be_hidden()

            page.get_by_role("link", name="Name", exact=True).click()  # the header sorts: descending, then ascending
            expect(page).to_have_url(re.compile(r"[?&]sort=-name"))
            page.get_by_role("link", name="Name ▼").click()
            expect(page).to_have_url(re.compile(r"[?&]sort=name"))
            names = page.locator("table.runs tbody tr td:nth-child(3) a")
            expect(names.first).to_have_text("walk failed")  # walk failed, walk launched elsewhere, ...

            page.locator("#view-menu summary").click()
            page.locator("#column-picker").get_by_label("Workload").uncheck()
            expect(page.locator("table.runs th.col-workload")).to_be_hidden()
            page.reload()  # kept in this browser, hidden from the first frame on
            assert page.evaluate("window.firstFrame.hidden") == "workload"
            expect(page.locator("table.runs th.col-workload")).to_be_hidden()
            expect(page.locator("table.runs td.col-loss svg.spark").first).to_be_visible()  # each run's loss, small
        assert not problems, "\n".join(problems)
    finally:
        context.close()


def test_a_wrong_field_keeps_the_new_run_forms_url_and_offers_the_shared_scripts(walk: Walk, page: Page) -> None:
    done = seeded(walk)["succeeded"]
    with watching(page, status=422) as problems:
        page.goto(f"{walk.server.url}/runs/new")
        expect(page.locator("details.group").last).not_to_have_attribute("open", "")  # Advanced, folded at defaults
        page.goto(f"{walk.server.url}/runs/new?from_run={done.id}")
        offered = page.locator("#scripts-offered option").evaluate_all("os => os.map((o) => o.value)")
        # The shared folder's scripts/ (the shipped examples, and the walk's own), as the form posts them.
        assert {"scripts/ddp_train.py", "scripts/walk_train.py"} <= set(offered) and offered == sorted(offered)
        page.get_by_label("Epochs").fill("0")
        page.get_by_role("button", name="Start run").click()
        expect(page.locator("#e-epochs")).to_contain_text("greater than or equal to 1")
        assert page.url.endswith(f"/runs/new?from_run={done.id}")  # the form's URL, not the POST's elsewhere
        expect(page.get_by_role("link", name="Epochs")).to_have_attribute("href", "#f-epochs")
    assert not problems, "\n".join(problems)
