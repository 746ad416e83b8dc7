"""Fixtures of the end-to-end tests: one headless Chromium per module, a fresh page per test; a Slurm cluster."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.slurm import slurm_cluster, slurm_missing

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture(scope="session")
def slurm() -> Iterator[dict[str, str]]:
    """A one-node Slurm cluster on this host for the whole session; the environment its clients need."""
    why = slurm_missing()
    if why:
        pytest.skip(f"Slurm: {why}")
    with slurm_cluster() as env:
        yield env
