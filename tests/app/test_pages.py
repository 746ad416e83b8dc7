"""The pages a person uses: the runs list, the new-run form with its defaults and errors, a run's page."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient

from app.core.models import Run, RunStatus, utcnow
from app.core.option_text import as_form_text
from app.schemas.runs import RunCreate

FORM_DEFAULTS = as_form_text(RunCreate().model_dump())  # what the form posts when nothing is changed


def test_empty_runs_list_says_what_to_do_and_offers_the_demo(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert "No runs yet" in page.text and "Start the demo run" in page.text
    assert "Shared storage" in page.text


def test_demo_button_creates_a_run_and_opens_its_page(client: TestClient) -> None:
    response = client.post("/runs", data={}, follow_redirects=False)  # what the button posts: every default
    assert response.status_code == 303
    run_page = client.get(response.headers["location"])
    assert "queued" in run_page.text and 'sse-connect="/runs/1/stream?after=0"' in run_page.text


def test_form_shows_each_fields_default_and_range(client: TestClient) -> None:
    page = client.get("/runs/new").text
    assert 'name="epochs" type="number" value="10"' in page
    assert "Default 10; 1 to 100,000." in page
    assert "Default 2; 1 to 2." in page  # processes per node: capped at what this host can run


def test_a_wrong_value_is_explained_next_to_its_field_and_nothing_is_created(client: TestClient) -> None:
    data = {**FORM_DEFAULTS, "epochs": "0", "lr": "fast", "name": "kept"}
    response = client.post("/runs", data=data)
    assert response.status_code == 422
    assert 'id="e-epochs"' in response.text and "greater than or equal to 1" in response.text
    assert 'id="e-lr"' in response.text
    assert 'value="kept"' in response.text  # what was typed is kept
    assert client.get("/api/runs").json()["total"] == 0


def test_too_many_processes_is_explained_on_the_form(client: TestClient) -> None:
    response = client.post("/runs", data={**FORM_DEFAULTS, "nproc_per_node": "64"})
    assert response.status_code == 422 and 'id="e-nproc_per_node"' in response.text
    assert "at most 2" in response.text


def test_user_text_is_escaped(client: TestClient) -> None:
    client.post("/api/runs", json={"name": "<script>alert(1)</script>"})
    page = client.get("/").text
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page


def test_runs_table_refreshes_as_a_fragment(client: TestClient) -> None:
    client.post("/api/runs", json={"name": "listed"})
    fragment = client.get("/", headers={"HX-Request": "true", "HX-Target": "runs-table"}).text
    assert fragment.lstrip().startswith('<div id="runs-table"') and "listed" in fragment and "<html" not in fragment


def test_the_list_shows_how_long_each_run_has_taken_live_or_ended(client: TestClient) -> None:
    for name in ("training", "done"):
        client.post("/api/runs", json={"name": name})
    now = utcnow()
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        live, ended = db.get(Run, 1), db.get(Run, 2)
        live.status, live.started_at = RunStatus.running, now - timedelta(hours=2, minutes=3)
        ended.status, ended.started_at = RunStatus.succeeded, now - timedelta(hours=5)
        ended.finished_at = ended.started_at + timedelta(minutes=7, seconds=5)
    for headers in ({}, {"HX-Request": "true", "HX-Target": "runs-table"}):  # the page, and its 2 s refresh
        response = client.get("/", headers=headers)
        assert response.status_code == 200
        assert "<td>2h 03m</td>" in response.text and "<td>7m 05s</td>" in response.text


def test_stop_from_the_page_returns_the_status_fragment(client: TestClient) -> None:
    client.post("/api/runs", json={})
    fragment = client.post("/runs/1/stop", headers={"HX-Request": "true"}).text
    assert "stopped before it started" in fragment and "<html" not in fragment


def test_the_sweep_button_queues_the_config_at_each_size_and_the_page_shows_the_table(client: TestClient) -> None:
    client.post("/api/runs", json={"name": "origin", "epochs": 3})
    response = client.post("/runs/1/sweep", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/runs/1#sweep"
    page = client.get("/runs/1").text
    assert 'data-processes="1"' in page and 'data-processes="2"' in page  # this host holds 2 processes
    assert client.get("/api/runs").json()["total"] == 3


def test_unknown_run_page_is_a_404_page(client: TestClient) -> None:
    response = client.get("/runs/42")
    assert response.status_code == 404 and "run 42 does not exist" in response.text


def test_vendored_assets_are_served_locally(client: TestClient) -> None:
    page = client.get("/runs/new").text
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page
    for asset in (
        "/static/vendor/htmx-2.0.11.min.js",
        "/static/vendor/htmx-ext-sse-2.2.4.js",
        "/static/vendor/uPlot-1.6.32.iife.min.js",
        "/static/run.js",
    ):
        assert client.get(asset).status_code == 200
