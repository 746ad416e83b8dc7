"""The pages a person uses: the runs list, the new-run form with its defaults and errors, a run's page."""

from __future__ import annotations

import re
from datetime import timedelta

from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import event

from app.core.models import Run, RunStatus, utcnow
from app.core.option_text import as_form_text
from app.schemas.runs import RunCreate
from tests.app.conftest import move_run, post, running_run

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
    assert "queued" in run_page.text and 'sse-connect="/runs/1/stream?parts=fragments"' in run_page.text


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
        assert '<td class="col-duration">2h 03m</td>' in response.text
        assert '<td class="col-duration">7m 05s</td>' in response.text


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


def test_the_form_is_in_groups_and_the_advanced_options_start_folded(client: TestClient) -> None:
    page = client.get("/runs/new").text
    legends = re.findall(r"<legend>(.*?)</legend>", page)
    assert legends == ["What to run", "Resources", "Training", "Checkpoints"]  # no Slurm here: its group is left out
    folded = re.search(r'<details class="group">\s*<summary>Advanced: DDP, NCCL, desync checks', page)
    assert folded and "all at their defaults" in page
    assert all(page.count(f'name="{name}"') == 1 for name in RunCreate.model_fields if not name.startswith("slurm_"))


def test_a_wrong_field_renders_the_form_again_at_its_own_url_opening_its_group(client: TestClient) -> None:
    """The form posts to its own URL (no action): after an error the address bar still shows the form's."""
    assert '<form class="run-form" method="post" novalidate>' in client.get("/runs/new").text
    values = {**FORM_DEFAULTS, "epochs": "0", "nccl_env": "NCCL_DEBUG INFO"}
    response = client.post("/runs/new?from_run=1", data=values)
    assert response.status_code == 422 and response.url.path == "/runs/new"
    assert (
        '<a href="#f-epochs">Epochs</a>' in response.text
        and '<a href="#f-nccl_env">NCCL environment</a>' in response.text
    )
    assert re.search(r'<details class="group" open>\s*<summary>Advanced', response.text)  # its error shows
    assert client.get("/api/runs").json()["total"] == 0


def test_the_script_field_offers_the_scripts_of_the_shared_folder(client: TestClient) -> None:
    scripts = client.app.state.settings.shared / "scripts"  # type: ignore[attr-defined]
    (scripts / "team").mkdir(parents=True, exist_ok=True)
    (scripts / "team" / "train_gpt.py").write_text("print('hi')\n")
    page = client.get("/runs/new").text
    assert 'list="scripts-offered"' in page and '<option value="scripts/team/train_gpt.py"></option>' in page


def test_each_run_in_the_list_has_its_loss_sparkline_read_in_one_query_for_the_page(client: TestClient) -> None:
    engine = client.app.state.sessions.kw["bind"]  # type: ignore[attr-defined]
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda conn, cursor, sql, *rest: statements.append(sql))
    for count in (2, 4):
        while len(client.get("/api/runs").json()["items"]) < count:
            run_id = running_run(client, name=f"run {count}")
            points = [
                wire.Point("loss", step, 2.0 / step, rank, 1.7e9 + step) for step in range(1, 101) for rank in (0, 1)
            ]
            assert post(client, run_id, wire.Batch(tuple(points)).to_json()).status_code == 200
        statements.clear()
        page = client.get("/").text
        assert (
            page.count('<svg class="spark"') == count and len(re.findall(r'"loss from [\d.]+ to 0\.02"', page)) == count
        )
        assert sum("metric_tiers" in sql for sql in statements) == 1  # one query, however many runs the page shows


def test_a_long_runs_sparkline_ends_at_its_last_step_inside_a_coarse_bucket_still_open(client: TestClient) -> None:
    """3,000 steps are read at the tier of 256 steps, whose bucket of steps 2,816-3,071 is not yet built (it is,
    once the run passes step 3,071): the line still ends at step 3,000's loss, 2 / 3,000."""
    run_id = running_run(client)
    for first in range(1, 3001, 500):
        points = tuple(wire.Point("loss", step, 2.0 / step, 0, 1.7e9 + step) for step in range(first, first + 500))
        assert post(client, run_id, wire.Batch(points).to_json()).status_code == 200
    assert 'to 0.0006667"' in client.get("/").text


def test_the_run_page_says_what_would_cut_communication_only_while_it_holds_on_a_run_long_enough(
    client: TestClient,
) -> None:
    """75% of each step in all-reduce: a toy run (a minute) gets the figures alone; an hour-long one, while it runs,
    what would help; once it ended, the figures again."""
    run_id = running_run(client)
    per_step = {"rank/comm_ms": 15.0, "rank/step_ms": 20.0, "rank/allreduce_ms": 16.0, "rank/backward_ms": 4.0,
                "rank/optimizer_ms": 1.0, "rank/buckets": 1.0}  # fmt: skip
    timings = tuple(wire.Point(key, step, ms, rank, 1.7e9) for step in range(1, 11) for rank in (0, 1)
                    for key, ms in per_step.items())  # fmt: skip
    assert post(client, run_id, wire.Batch(timings).to_json()).status_code == 200

    def said() -> tuple[bool, bool]:
        page = client.get(f"/runs/{run_id}").text
        assert 'id="comm-share">75% of each step waits on all-reduce' in page
        return "would help" in page, "comm-dominates" in page

    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).started_at = utcnow() - timedelta(minutes=1)
    assert said() == (False, False)
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).started_at = utcnow() - timedelta(hours=1)
    assert said() == (True, True)
    move_run(client, run_id, RunStatus.succeeded)
    assert said() == (False, False)


def test_a_healthy_run_has_no_forensic_section_and_no_empty_alerts_table(client: TestClient) -> None:
    run_id = running_run(client)
    page = client.get(f"/runs/{run_id}").text
    assert 'id="dump-button"' in page and 'class="quiet" id="dump-button"' in page  # the quiet action alone
    assert 'id="dump"' not in page and "Which rank, and why" not in page and 'id="run-alerts"' not in page
