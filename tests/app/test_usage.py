"""Usage by user, tag and launcher over a period, as the API, its CSV, the Usage page and `rankboard usage` show it;
runs built in a real SQLite store (tests/app/cost_runs.py)."""

from __future__ import annotations

import csv
import io
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.command import downgrade
from alembic.command import upgrade as upgrade_to
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import inspect, select, text

from app.core.db import alembic_config, make_engine, upgrade
from app.core.models import LaunchCost, Role, Run, RunEvent, RunStatus, utcnow
from app.core.settings import Settings
from app.main import create_app
from app.services import tokens, users
from tests.app.cost_runs import T0, Plan, at, build, launches
from tests.app.test_cost import PLANS, PRICES
from tests.live import REPO, LiveServer, open_run, server_db

Q, S = RunStatus.queued, RunStatus.starting
HOUR = 3600


def long_run(name: str = "long", owner: str = "ada", tags: list[str] | None = None) -> Plan:
    """Two GPUs for three hours from Sunday 22:00 (week 45) to Monday 01:00 (week 46): no ledger, no samples."""
    events = [(0, Q, "created"), (0, S, "torchrun started"), (3 * HOUR, RunStatus.succeeded, "done")]
    return Plan(name, events, owner=owner, tags=tags or [], script="train.py")


@pytest.fixture
def store(settings: Settings) -> Iterator[tuple[TestClient, dict[str, int]]]:
    with TestClient(create_app(settings.model_copy(update={"gpu_prices": PRICES}))) as client:
        yield client, {name: build(client, plan) for name, plan in PLANS.items()}


def usage(client: TestClient, **query: str) -> dict[str, Any]:
    answer = client.get("/api/usage", params=query)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_usage_groups_runs_by_user_tag_and_launcher_and_sums_their_costs(
    store: tuple[TestClient, dict[str, int]],
) -> None:
    client, runs = store
    each = {name: client.get(f"/api/runs/{run_id}/cost").json() for name, run_id in runs.items()}
    by_user = {row["group"]: row for row in usage(client, by="user")["rows"]}
    assert set(by_user) == {"ada", "bob", "cy"}
    ada = [each[name] for name, plan in PLANS.items() if plan.owner == "ada"]
    assert by_user["ada"]["runs"] == len(ada)
    assert by_user["ada"]["gpu_hours"] == pytest.approx(sum(c["device_hours"] for c in ada if c["device"] == "gpu"))
    assert by_user["ada"]["cost"] == pytest.approx(sum(c["cost"] or 0 for c in ada))
    assert by_user["cy"]["gpu_hours"] == 0 and by_user["cy"]["cpu_hours"] == pytest.approx(2 * 600 / HOUR)
    assert by_user["cy"]["cost"] is None and by_user["cy"]["goodput"] is None
    bob = [each["resumed"], each["failed"]]  # both itemized: their goodput weighted by their GPU-hours
    assert by_user["bob"]["goodput"] == pytest.approx(
        sum(c["goodput"] * c["device_hours"] for c in bob) / sum(c["device_hours"] for c in bob)
    )
    by_tag = {row["group"]: row for row in usage(client, by="tag")["rows"]}
    assert by_tag["llm"]["runs"] == 2 and by_tag["big"]["runs"] == 1 and by_tag["(no tag)"]["runs"] == 4
    total = usage(client, by="tag")["total"]
    assert total["runs"] == len(PLANS)  # each run once, though a run with two tags is in two rows
    assert total["gpu_hours"] == pytest.approx(sum(c["device_hours"] for c in each.values() if c["device"] == "gpu"))
    assert [row["group"] for row in usage(client, by="launcher")["rows"]] == ["local"]


def test_a_period_counts_each_launch_by_its_overlap_and_splits_it_by_iso_week(settings: Settings) -> None:
    with TestClient(create_app(settings)) as client:
        build(client, long_run())
        whole = usage(client, by="user")
        assert whole["total"]["gpu_hours"] == pytest.approx(2 * 3)
        assert [(w["week"], w["gpu_hours"]) for w in whole["weeks"]] == [("2026-W45", 4.0), ("2026-W46", 2.0)]
        part = usage(client, by="user", **{"from": at(HOUR).isoformat(), "to": at(2.5 * HOUR).isoformat()})
        assert part["total"]["gpu_hours"] == pytest.approx(2 * 1.5) and part["rows"][0]["runs"] == 1
        assert [(w["week"], w["gpu_hours"]) for w in part["weeks"]] == [("2026-W45", 2.0), ("2026-W46", 1.0)]
        assert [w["starts"] for w in part["weeks"]] == ["2026-11-02", "2026-11-09"]
        before = usage(client, by="user", to=(T0 - timedelta(days=1)).date().isoformat())
        assert before["rows"] == [] and before["total"]["runs"] == 0


def test_usage_as_csv_by_parameter_or_by_accept_header(store: tuple[TestClient, dict[str, int]]) -> None:
    client, _ = store
    answer = client.get("/api/usage", params={"by": "user", "format": "csv"})
    assert answer.headers["content-type"].startswith("text/csv")
    assert 'filename="rankboard-usage-by-user.csv"' in answer.headers["content-disposition"]
    table = list(csv.DictReader(io.StringIO(answer.text)))
    assert [row["group"] for row in table] == [row["group"] for row in usage(client, by="user")["rows"]] + ["(all)"]
    assert table[-1]["runs"] == str(len(PLANS)) and float(table[-1]["cost"]) > 0
    assert next(row for row in table if row["group"] == "cy")["cost"] == ""  # unknown: an empty cell, not 0
    accepted = client.get("/api/usage", params={"by": "tag"}, headers={"Accept": "text/csv"})
    assert accepted.text.splitlines()[0] == "group,runs,gpu_hours,cpu_hours,kwh,cost,unpriced_gpu_hours,goodput"


def test_a_viewer_sees_every_users_runs_but_none_being_deleted(settings: Settings) -> None:
    """Runs are not private (app.auth.policy: a viewer reads everything), so a viewer's usage counts the other users'
    runs, as the runs list shows them; a run being deleted is shown nowhere, so neither here."""
    with TestClient(create_app(settings)) as client:
        build(client, long_run("ada's", owner="ada"))
        gone = build(client, long_run("bob's", owner="bob"))
        build(client, long_run("bob's other", owner="bob"))
        with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
            db.get(Run, gone).deleting_at = utcnow()
    guarded = settings.model_copy(update={"admin_password": SecretStr("an admin's passw0rd")})
    with TestClient(create_app(guarded)) as client:
        with client.app.state.sessions() as db:  # type: ignore[attr-defined]
            users.add_user(db, name="vera", role=Role.viewer, password="vera's passw0rd", actor="test")
            secret = tokens.create_token(db, name="vera-ci", role=Role.viewer, expires="1d", owner="vera",
                                         actor="test").secret  # fmt: skip
        assert client.get("/api/usage").status_code == 401
        body = client.get("/api/usage", headers={"Authorization": f"Bearer {secret}"}).json()
    assert {row["group"]: row["runs"] for row in body["rows"]} == {"ada": 1, "bob": 1}


def test_the_usage_page_with_no_run_one_and_many(settings: Settings) -> None:
    with TestClient(create_app(settings.model_copy(update={"gpu_prices": PRICES}))) as client:
        empty = client.get("/usage")
        assert empty.status_code == 200 and "No run held a GPU or a CPU process in this period." in empty.text
        assert '<a href="/usage">Usage</a>' in empty.text  # in every page's nav
        build(client, long_run(tags=["vision"]))
        one = client.get("/usage", params={"by": "tag"}).text
        assert 'id="usage-table"' in one and 'data-group="vision"' in one and 'id="usage-chart"' in one
        assert "$14.94" in one  # 6 GPU-hours of H100 at $2.49
        for plan in PLANS.values():
            build(client, plan)
        many = client.get("/usage", params={"by": "user", "from": "2026-11-01"}).text
        for group in ("ada", "bob", "cy", "(all)"):
            assert f'data-group="{group}"' in many
        assert 'href="/api/usage?by=user&amp;from=2026-11-01&amp;format=csv"' in many
        assert client.get("/usage", params={"by": "nobody"}).status_code == 422


def test_rankboard_usage_prints_the_table_from_a_live_server(live_server: LiveServer) -> None:
    run_id = open_run(live_server, "t0ken")
    with server_db(live_server) as db:  # two hours on one H100, ended an hour ago
        run = db.get(Run, run_id)
        run.owner, run.status = "ada", RunStatus.succeeded
        run.gpus = [{"host": "node-a", "gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100"}]}]
        run.world_size = run.nproc_per_node = 1
        run.created_at, run.finished_at = utcnow() - timedelta(hours=3), utcnow() - timedelta(hours=1)
        for event in run.events:
            event.at = run.created_at
        db.add(RunEvent(run_id=run_id, at=run.finished_at, status=RunStatus.succeeded, reason="done"))
    command = [str(REPO / ".venv" / "bin" / "rankboard"), "usage", "--by", "user", "--since", "30d",
               "--url", live_server.url]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["user", "runs", "GPU-hours", "CPU-hours", "kWh", "cost", "goodput"]
    assert lines[1].split()[:3] == ["ada", "1", "2.00"] and lines[2].split()[:3] == ["(all)", "1", "2.00"]
    bad = subprocess.run([*command[:5], "last month"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "'last month' is not 30d, 12h, 2w, 90m nor a date" in bad.stderr


def test_metrics_carry_each_live_runs_gpu_hours_and_energy_and_every_runs_total(settings: Settings) -> None:
    """Bounded: the run that ended long ago is in the total only; the live one has series of its own."""
    from prometheus_client.parser import text_string_to_metric_families

    with TestClient(create_app(settings.model_copy(update={"prometheus": True}))) as client:
        build(client, long_run())  # 2 GPUs x 3 h, ended in 2026-11
        live = build(client, Plan("live", [(0, Q, "created"), (0, S, "torchrun started")], power=None))
        with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
            run = db.get(Run, live)
            run.status = RunStatus.running
            for event in run.events:  # launched an hour ago
                event.at = utcnow() - timedelta(hours=1)
        scraped = client.get("/metrics").text
    found = {s.name: s for family in text_string_to_metric_families(scraped) for s in family.samples
             if "hours" in s.name or "joules" in s.name}  # fmt: skip
    assert found["rankboard_run_gpu_hours_total"].labels == {"run_id": str(live), "run_name": "live"}
    assert found["rankboard_run_gpu_hours_total"].value == pytest.approx(2 * 1, rel=0.01)
    assert found["rankboard_gpu_hours_total"].value == pytest.approx(2 * 3 + 2 * 1, rel=0.01)
    assert found["rankboard_cpu_hours_total"].value == 0 and found["rankboard_energy_joules_total"].value == 0


def stored_launches(client: TestClient) -> dict[int, list[tuple[int, float | None]]]:
    """run_costs as it is: per run, each stored launch's number and device-hours."""
    found: dict[int, list[tuple[int, float | None]]] = {}
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        for row in db.scalars(select(LaunchCost).order_by(LaunchCost.run_id, LaunchCost.attempt)):
            found.setdefault(row.run_id, []).append((row.attempt, row.device_hours))
    return found


def test_a_settled_runs_launches_are_measured_once_and_read_back_after_a_restart(settings: Settings) -> None:
    """The first report stores each settled run's launches; a server started later answers the same from them
    without its samples (deleted here to show it), at the prices of the day; deleting a run deletes its rows."""
    with TestClient(create_app(settings.model_copy(update={"gpu_prices": PRICES}))) as client:
        runs = {name: build(client, plan) for name, plan in PLANS.items()}
        first = {by: {**usage(client, by=by), "end": None} for by in ("user", "tag")}  # end: now
        stored = stored_launches(client)
        for name, plan in PLANS.items():
            assert [hours for _, hours in stored[runs[name]]] == pytest.approx(
                [(len(plan.gpus) or plan.ranks) * (end - launch) / HOUR for launch, end in launches(plan)]
            ), name
        with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
            db.execute(text("DELETE FROM metric_chunks"))  # the samples and ledgers the rows were measured from
    with TestClient(create_app(settings.model_copy(update={"gpu_prices": PRICES}))) as client:
        assert {by: {**usage(client, by=by), "end": None} for by in ("user", "tag")} == first
        assert client.delete(f"/api/runs/{runs['killed']}").status_code == 200
        assert runs["killed"] not in stored_launches(client) and len(stored_launches(client)) == len(PLANS) - 1
    with TestClient(create_app(settings.model_copy(update={"gpu_prices": {"H100": 4.98}}))) as client:
        ada = next(row for row in usage(client, by="user")["rows"] if row["group"] == "ada")
    held = {name: sum(end - launch for launch, end in launches(PLANS[name])) / HOUR for name in ("script", "preempted")}
    assert ada["cost"] == pytest.approx(4.98 * 2 * held["script"])  # the killed run is gone; the A100 has no price
    assert ada["unpriced_gpu_hours"] == pytest.approx(held["preempted"])


def test_a_resumed_run_is_measured_again_when_it_has_settled_again(settings: Settings) -> None:
    """Its stored launches are for its first end: while it runs again it is measured live, and once it has ended
    again and settled, its two launches are stored; a run that ended a minute ago is measured, not yet stored."""
    with TestClient(create_app(settings)) as client:
        run_id = build(client, long_run())
        assert usage(client, by="user")["total"]["gpu_hours"] == pytest.approx(2 * 3)
        assert stored_launches(client) == {run_id: [(0, pytest.approx(6))]}
        resumed = utcnow() - timedelta(hours=1)
        with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
            run = db.get(Run, run_id)
            run.status, run.finished_at = RunStatus.running, None  # as runs.resume and the launch leave it
            db.add_all([RunEvent(run_id=run_id, at=resumed, status=Q, reason="resume requested"),
                        RunEvent(run_id=run_id, at=resumed, status=S, reason="torchrun started")])  # fmt: skip
        assert usage(client, by="user")["total"]["gpu_hours"] == pytest.approx(6 + 2 * 1, rel=1e-3)
        with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
            run = db.get(Run, run_id)
            run.status, run.finished_at = RunStatus.succeeded, resumed + timedelta(minutes=59)
            db.add(RunEvent(run_id=run_id, at=run.finished_at, status=RunStatus.succeeded, reason="done"))
        assert usage(client, by="user")["total"]["gpu_hours"] == pytest.approx(6 + 2 * 59 / 60)
        assert stored_launches(client) == {run_id: [(0, pytest.approx(6))]}  # for its first end: stale, not read
        with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
            run = db.get(Run, run_id)  # as if all this happened an hour earlier: it has settled since
            for thing in [run, *(event for event in run.events if event.at >= resumed)]:
                attribute = "finished_at" if thing is run else "at"
                setattr(thing, attribute, getattr(thing, attribute) - timedelta(hours=1))
        assert usage(client, by="user")["total"]["gpu_hours"] == pytest.approx(6 + 2 * 59 / 60)
        assert stored_launches(client) == {run_id: [(0, pytest.approx(6)), (1, pytest.approx(2 * 59 / 60))]}


COSTS_REVISION = "0023_run_costs"


def assert_the_run_costs_migration_measures_old_runs_and_goes_back(url: str, tmp_path: Path) -> None:
    """A store from before run_costs: after the upgrade the table is empty, the first report measures its old run
    (two CPU processes for 90 minutes) and stores it; a downgrade drops the table and keeps the run."""
    before = ScriptDirectory.from_config(alembic_config(url)).get_revision(COSTS_REVISION).down_revision
    assert isinstance(before, str)
    upgrade_to(alembic_config(url), before)
    engine = make_engine(url)
    created, ended = datetime(2026, 1, 5, 9, 0), datetime(2026, 1, 5, 10, 30)
    with engine.begin() as connection:
        run_id = connection.scalar(text(
            "INSERT INTO runs (name, status, status_reason, created_at, finished_at, workload, nproc_per_node, epoch,"
            " step, total_steps, samples_per_s, trainer_finished, owner) VALUES ('old', 'succeeded', '', :created,"
            " :ended, 'mlp', 2, 0, 0, 0, 0, false, 'ada') RETURNING id"
        ), {"created": created, "ended": ended})  # fmt: skip
        connection.execute(text("INSERT INTO run_events (run_id, at, status, reason) VALUES (:run, :at, :status, '')"),
                           [{"run": run_id, "at": created, "status": "starting"},
                            {"run": run_id, "at": ended, "status": "succeeded"}])  # fmt: skip
    upgrade(url)
    settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared", database_url=url,
                        supervise_interval_s=3600)  # fmt: skip
    with TestClient(create_app(settings)) as client:
        assert stored_launches(client) == {}
        assert usage(client, by="user")["rows"][0] == {
            "group": "ada", "runs": 1, "gpu_hours": 0.0, "cpu_hours": 3.0, "kwh": None, "cost": None,
            "unpriced_gpu_hours": 0.0, "goodput": None}  # fmt: skip
        assert stored_launches(client) == {run_id: [(0, 3.0)]}
    downgrade(alembic_config(url), before)
    with engine.connect() as connection:
        assert "run_costs" not in inspect(connection).get_table_names()
        assert connection.scalar(text("SELECT name FROM runs")) == "old"
    engine.dispose()


def test_a_store_from_before_run_costs_is_measured_after_the_upgrade_and_goes_back(tmp_path: Path) -> None:
    assert_the_run_costs_migration_measures_old_runs_and_goes_back(f"sqlite:///{tmp_path / 'old.db'}", tmp_path)
