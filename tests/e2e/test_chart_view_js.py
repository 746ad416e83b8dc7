"""The chart view's pure functions (static/charts/view.js), run in a real headless Chromium as the page runs them:
smoothing equals TensorBoard's to 1e-9, a view survives its URL, the outlier range, the ranks' mean and the filter.

The module is served to the browser from the working tree by the test itself (no server): it imports nothing."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, Route

pytestmark = [pytest.mark.browser]

STATIC = Path(__file__).resolve().parents[2] / "static"
ORIGIN = "http://rankboard.test"


def serve(route: Route) -> None:
    path = route.request.url.removeprefix(ORIGIN)
    if path.startswith("/static/"):
        route.fulfill(path=STATIC / path.removeprefix("/static/"), content_type="text/javascript")
    else:
        route.fulfill(body="<!doctype html><title>view.js</title>", content_type="text/html")


@pytest.fixture
def view_js(page: Page) -> Page:
    """A page that has imported view.js as `window.view`."""
    page.route(f"{ORIGIN}/**", serve)
    page.goto(f"{ORIGIN}/")
    page.evaluate("async () => { window.view = await import('/static/charts/view.js'); }")
    return page


def tensorboard(values: list[float], weight: float) -> list[float]:
    """TensorBoard's scalar smoothing (classicSmoothing in its webapp's line chart), transcribed: a constant series
    as it is; otherwise each finite value feeds the moving average, debiased by the count of finite values so far;
    NaN and infinities pass through and are not fed in."""
    if all(v == values[0] for v in values):
        return list(values)
    last, finite, out = 0.0, 0, []
    for value in values:
        if not math.isfinite(value):
            out.append(value)
            continue
        last = last * weight + (1 - weight) * value
        finite += 1
        out.append(last / (1 if weight == 1 else 1 - weight**finite))
    return out


def same(got: list[float], want: list[float], tolerance: float = 1e-9) -> bool:
    return len(got) == len(want) and all(
        (math.isnan(g) and math.isnan(w)) or g == w or abs(g - w) <= tolerance for g, w in zip(got, want, strict=True)
    )


def test_smoothing_equals_tensorboards_formula(view_js: Page) -> None:
    rng = random.Random(37)
    loss = [11.9 * math.exp(-step / 30) + 0.008 + rng.gauss(0, 0.05) for step in range(1, 2001)]
    for at, bad in ((0, math.nan), (5, math.inf), (100, math.nan), (101, -math.inf), (1999, math.nan)):
        loss[at] = bad  # a first value that is NaN, and others: not fed in, not counted for the debiasing
    for weight in (0.0, 0.3, 0.6, 0.9, 0.99):
        got = view_js.evaluate("([values, w]) => window.view.smooth(values, w)", [loss, weight])
        assert same(got, tensorboard(loss, weight)), weight
    assert view_js.evaluate("window.view.smooth([2, 2, 2], 0.9)") == [2, 2, 2]  # constant: left as it is
    assert same(view_js.evaluate("window.view.smooth([NaN, 1, 3], 0.5)"), [math.nan, 1.0, 1.75 / 0.75])


VIEWS: list[dict[str, Any]] = [
    {},
    {"filter": "loss|acc (train", "pins": ["loss", "k-train-loss-fe909792"], "folded": ["top", "s-many-f2547020"],
     "smoothing": 0.6, "logY": True, "x": "rel", "outliers": True, "ranks": "mean",
     "charts": {"lr": {"smoothing": 0.9, "logY": False, "x": "wall", "outliers": True, "zoom": [100, 2000]},
                "k-fccb96dd": {"zoom": [0, 5]}, "gpu-util": {"smoothing": 0, "x": "step"}}},
    {"filter": "损失|ünï/x & more", "ranks": "rank0", "x": "wall", "smoothing": 0.99},
    {"folded": []},  # every section opened by hand, the ones folded by default too: not the same as the default
]  # fmt: skip


@pytest.mark.parametrize("changes", VIEWS)
def test_a_view_survives_its_url(view_js: Page, changes: dict[str, Any]) -> None:
    view = view_js.evaluate("(changes) => ({...window.view.DEFAULT_VIEW, ...changes})", changes)
    search = view_js.evaluate("(v) => window.view.encodeView(v, '?tab=logs')", view)
    assert search.startswith("tab=logs")  # the page's other parameters are kept
    assert view_js.evaluate("(s) => window.view.decodeView(s)", search) == view
    view_js.evaluate("(s) => history.replaceState(null, '', '/?' + s)", search)  # through a real URL, too
    assert view_js.evaluate("window.view.decodeView(location.search)") == view
    assert view_js.evaluate("window.view.encodeView(window.view.DEFAULT_VIEW)") == ""  # the default view: a bare URL


def test_a_url_that_names_nonsense_gives_the_default_for_it(view_js: Page) -> None:
    view = view_js.evaluate("window.view.decodeView('x=sideways&smooth=lots&ranks=7&logy=2&c.lr=zfoo_xup&c.a=s5')")
    default = view_js.evaluate("window.view.DEFAULT_VIEW")
    assert view == {**default, "charts": {"a": {"smoothing": 0.99}}}  # only the one readable part, capped


def test_ignoring_outliers_fits_the_bulk_of_the_points(view_js: Page) -> None:
    values = [1.0 + (i % 10) / 10 for i in range(1000)] + [500.0, math.nan, math.inf]
    lo, hi = view_js.evaluate("(v) => window.view.outlierRange(v)", values)
    assert 0.9 < lo < 1.0 and 1.9 < hi < 2.0  # the spike at 500 and the non-finite values are out of it
    lo, hi = view_js.evaluate("(v) => window.view.outlierRange(v, {log: true})", [-1.0, 0.0, 0.01, 1.0, 100.0])
    assert 0 < lo < 0.01 and hi > 100  # on a log scale: only the positive values, padded by a factor


def test_the_ranks_mean_and_band_hold_each_ranks_latest_value(view_js: Page) -> None:
    lines = [
        {"steps": [1, 2, 3], "last": [1.0, 2.0, 3.0], "time": [10.0, 20.0, 30.0]},
        {"steps": [1, 3], "last": [3.0, math.nan], "time": [12.0, 32.0]},
    ]
    mean = view_js.evaluate("(lines) => window.view.rankMean(lines)", lines)
    assert mean["steps"] == [1, 2, 3]
    assert mean["last"] == [2.0, 2.5, 3.0]  # step 2: rank 1 still at 3; step 3: its NaN left out
    assert mean["min"] == [1.0, 2.0, 3.0] and mean["max"] == [3.0, 3.0, 3.0]
    assert mean["time"] == [11.0, 16.0, 31.0]


def test_the_filter_is_a_regex_or_else_a_substring(view_js: Page) -> None:
    check = "([filter, words]) => words.map((w) => window.view.matcher(filter)(w))"
    words = ["train/loss", "val/acc", "损失", "loss(raw)"]
    assert view_js.evaluate(check, ["^train/|acc$", words]) == [True, True, False, False]
    assert view_js.evaluate(check, ["LOSS(", words]) == [False, False, False, True]  # not a regex: a substring
    assert view_js.evaluate(check, ["损", words]) == [False, False, True, False]
