"""The run page's server-sent events: points, status and output fragments, resumable by Last-Event-ID."""

from __future__ import annotations

import json
import re
import time

import pytest
from fastapi.testclient import TestClient

from app.core.models import RunStatus
from app.services import metrics
from app.store import metrics as metric_store
from app.web.stream import Fragments, SharedFragments
from tests.app.conftest import batch, move_run, post, running_run


def events(text: str) -> list[tuple[str, str, str | None]]:
    """(event, data, id) of each message of an SSE body."""
    parsed = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, list[str]] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            fields.setdefault(name, []).append(value)
        parsed.append((fields["event"][0], "\n".join(fields.get("data", [])), (fields.get("id") or [None])[0]))
    return parsed


def finish(client: TestClient, run_id: int) -> None:
    move_run(client, run_id, RunStatus.succeeded)


def test_a_finished_runs_stream_sends_everything_then_ends(client: TestClient, run_id: int) -> None:
    post(client, run_id, batch(1, 2, 3))
    finish(client, run_id)
    received = events(client.get(f"/runs/{run_id}/stream").text)
    kinds = [kind for kind, _, _ in received]
    # No forensic fragment (the stream's "output" event) for a run with nothing to say: its page shows none.
    assert kinds == ["points", "status", "files", "end"]
    points = json.loads(received[0][1])["series"]["loss"]
    assert points["steps"] == [1, 2, 3] and points["ranks"] == [0, 0, 0]
    assert points["times"] == [1.7e9 + 1, 1.7e9 + 2, 1.7e9 + 3]  # each point's own time, for a wall-time axis
    assert 'id="status"' in received[1][1] and "succeeded" in received[1][1]
    assert "<h2>Checkpoints</h2>" in received[2][1] and "<h2>History</h2>" in received[2][1]


def test_a_reconnecting_page_gets_only_what_it_has_not_seen(client: TestClient, run_id: int) -> None:
    post(client, run_id, batch(1, 2))
    finish(client, run_id)
    last_id = events(client.get(f"/runs/{run_id}/stream").text)[0][2]
    move_run(client, run_id, RunStatus.running)
    post(client, run_id, batch(2, 3, 4))  # step 2 again (a retry): stored once, so never sent twice
    finish(client, run_id)
    again = events(client.get(f"/runs/{run_id}/stream", headers={"Last-Event-ID": str(last_id)}).text)
    assert json.loads(again[0][1])["series"]["loss"]["steps"] == [3, 4]


def test_a_page_that_watches_some_keys_gets_their_points_and_only_the_names_of_the_others(
    client: TestClient, run_id: int
) -> None:
    """A page of 200 charts has built a few: it gets their points, and hears of the other keys (a new one, or news
    of a chart it builds later) by name only. A stream of points sends no fragments; one of fragments no points."""
    post(client, run_id, batch(1, 2))
    post(client, run_id, batch(1, 2, key="lr"))
    post(client, run_id, batch(1, key="train/acc"))
    finish(client, run_id)
    query = "parts=points&watch=loss&watch=train/acc"
    received = events(client.get(f"/runs/{run_id}/stream?{query}").text)
    assert [kind for kind, _, _ in received] == ["points", "end"]
    points = json.loads(received[0][1])
    assert sorted(points["series"]) == ["loss", "train/acc"] and points["series"]["loss"]["steps"] == [1, 2]
    assert points["others"] == ["lr"]
    fragments = events(client.get(f"/runs/{run_id}/stream?parts=fragments").text)
    assert [kind for kind, _, _ in fragments] == ["status", "files", "end"]  # no points; no forensic panel to show
    assert client.get(f"/runs/{run_id}/stream?parts=some").status_code == 422


def test_a_page_further_behind_than_the_live_log_is_told_to_read_its_charts_again(
    client: TestClient, run_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metric_store, "RECENT_POINTS", 500)  # the log keeps the newest 500 points
    for first in range(1, 2001, 100):
        post(client, run_id, batch(*range(first, first + 100)))
    finish(client, run_id)

    def first_points(last_event_id: int) -> dict:
        received = events(client.get(f"/runs/{run_id}/stream", headers={"Last-Event-ID": str(last_event_id)}).text)
        return json.loads(next(data for kind, data, _ in received if kind == "points"))

    behind = first_points(10)  # asleep while 1,990 points came: points 11 to 1,500 are gone from the log
    assert behind["missed"] and behind["series"]["loss"]["steps"][0] == 1501
    caught_up = first_points(1500)
    assert not caught_up["missed"] and caught_up["series"]["loss"]["steps"] == list(range(1501, 2001))
    # The charts it then reads have every point, those dropped from the log included.
    assert len(client.get(f"/api/runs/{run_id}/metrics/loss", params={"limit": 5000}).json()["points"]) == 2000


def test_a_quiet_runs_page_keeps_up_with_the_log_while_other_runs_fill_it(
    client: TestClient, run_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metric_store, "RECENT_POINTS", 500)
    busy = running_run(client, "busy")
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        cursor = metric_store.last_point_id(db)  # as the quiet run's page opened
    for first in range(1, 2001, 100):
        post(client, busy, batch(*range(first, first + 100)))
        with client.app.state.sessions() as db:  # type: ignore[attr-defined]
            poll = metrics.new_points(db, run_id=run_id, after_id=cursor)  # the quiet page's poll, once a second
        assert not poll.points and not poll.missed
        cursor = poll.cursor
    post(client, run_id, batch(7))
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        poll = metrics.new_points(db, run_id=run_id, after_id=cursor)
    assert [p.step for p in poll.points] == [7] and not poll.missed


def test_deleting_the_run_that_logged_last_never_numbers_a_point_again(client: TestClient, run_id: int) -> None:
    post(client, run_id, batch(1, 2))
    other = running_run(client, "other")
    post(client, other, batch(1, 2, 3))  # the log's newest points are the other run's
    page = client.get(f"/runs/{run_id}").text
    cursor = int(re.search(r"/stream\?parts=points&amp;after=(\d+)", page).group(1))  # type: ignore[union-attr]
    finish(client, other)
    assert client.delete(f"/api/runs/{other}").status_code == 200
    post(client, run_id, batch(3, 4))
    finish(client, run_id)
    received = events(client.get(f"/runs/{run_id}/stream", headers={"Last-Event-ID": str(cursor)}).text)
    sent = [
        step for kind, data, _ in received if kind == "points" for step in json.loads(data)["series"]["loss"]["steps"]
    ]
    assert sent == [3, 4]  # numbered after the cursor, not again below it


def test_stream_of_unknown_run_is_404(client: TestClient) -> None:
    assert client.get("/runs/77/stream").status_code == 404


def test_a_page_opened_right_after_a_resume_shows_the_run_as_it_is_now(client: TestClient, run_id: int) -> None:
    # Pages share a run's fragments for a second; what a finished run looked like must not be shared, or a page
    # opened the moment the run came back would show, and end on, what it was before.
    post(client, run_id, batch(1))
    move_run(client, run_id, RunStatus.succeeded)
    client.get(f"/runs/{run_id}/stream")
    move_run(client, run_id, RunStatus.running)
    post(client, run_id, batch(2))
    move_run(client, run_id, RunStatus.stopped)
    statuses = [data for kind, data, _ in events(client.get(f"/runs/{run_id}/stream").text) if kind == "status"]
    assert 'id="status">stopped<' in statuses[0]


def test_pages_of_one_run_share_one_rendering_a_second() -> None:
    shared, renderings = SharedFragments(max_age_s=0.5), []

    def render() -> Fragments:
        renderings.append(time.monotonic())
        return Fragments(f"status {len(renderings)}", "", "", final=False)

    first = [shared.get(1, render).status_html for _page in range(20)]
    other_run = shared.get(2, render).status_html
    time.sleep(0.6)
    later = shared.get(1, render).status_html
    assert first == ["status 1"] * 20 and other_run == "status 2" and later == "status 3"


def test_a_slow_rendering_is_shared_for_ten_times_what_it_took() -> None:
    # A big run's view (stragglers over every rank) may take a good part of a second: its pages then see it renewed
    # less often, rather than the server spending a core on it.
    shared, renderings = SharedFragments(max_age_s=0.05), []

    def render() -> Fragments:
        renderings.append(time.monotonic())
        time.sleep(0.2)
        return Fragments(f"status {len(renderings)}", "", "", final=False)

    first = shared.get(1, render).status_html
    time.sleep(0.3)  # past max_age_s, within ten times the rendering's 0.2 s
    assert (first, shared.get(1, render).status_html) == ("status 1", "status 1")
