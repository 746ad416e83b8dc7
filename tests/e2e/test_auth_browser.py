"""In a real headless Chromium, with authentication on: log in, start a run, stop it, log out, and the login page
again; every page works under the Content-Security-Policy (the API's Swagger page included), with no violation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import ConsoleMessage, Page, expect

from tests.live import LiveServer, run_processes, serving

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
PASSWORD = "browser-admin-pw"
UNAUTHORIZED = "Failed to load resource: the server responded with a status of 401 (Unauthorized)"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    settings = {"RANKBOARD_STOP_GRACE_S": "30", "RANKBOARD_SLOTS": "2", "RANKBOARD_ADMIN_PASSWORD": PASSWORD}
    with serving(tmp_path, **settings) as live:
        yield live


def console_errors(page: Page) -> list[str]:
    """The page's console errors as they come: a CSP violation is one ("Refused to ... Content Security Policy")."""
    errors: list[str] = []

    def note(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    page.on("console", note)
    return errors


def test_log_in_start_a_run_stop_it_log_out(server: LiveServer, page: Page) -> None:
    errors = console_errors(page)
    page.goto(server.url)
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()  # sent to log in first
    page.get_by_label("User").fill("admin")
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#login-error")).to_have_text("wrong user name or password")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_text("No runs yet")).to_be_visible()
    expect(page.locator("#who")).to_contain_text("admin")

    page.get_by_role("link", name="New run").first.click()
    page.get_by_label("Name").fill("behind a login")
    page.get_by_label("Epochs").fill("500")
    page.get_by_role("button", name="Start run").click()  # a plain form: its hidden CSRF field
    expect(page.get_by_role("heading", name="behind a login")).to_be_visible()
    expect(page.locator("#status")).to_have_text("running", timeout=60_000)  # the live stream, with the cookie
    page.get_by_role("button", name="Stop").click()  # htmx: the CSRF token as a header
    expect(page.locator("#status")).to_have_text("stopped", timeout=60_000)
    expect(page.locator("#audit")).to_contain_text("created by admin")
    expect(page.locator("#audit")).to_contain_text("stopped by admin")
    assert errors == [UNAUTHORIZED]  # the one error while logged in: the wrong password's answer

    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    page.goto(f"{server.url}/runs/1")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    # Since then, at most the run page's refresh, in flight as the session ended, answered 401 (no CSP violation).
    assert set(errors[1:]) <= {UNAUTHORIZED}, errors
    assert run_processes(server.root) == []


def test_the_api_page_works_under_the_content_security_policy(server: LiveServer, page: Page) -> None:
    errors = console_errors(page)
    page.goto(f"{server.url}/login?next=/docs")
    page.get_by_label("User").fill("admin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Rankboard", timeout=30_000)
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    page.goto(f"{server.url}/host")
    expect(page.locator("#system")).to_be_visible()
    assert errors == []
