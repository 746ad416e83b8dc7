"""The queue through the real app over a SQLite file, with authentication on: priorities as operators and admins
may give them, limits an admin sets, and what a waiting run says (its reason, its event, its place) after a tick.

This host's two slots are held by a run whose process is this test's, so that a tick decides without starting a
trainer; what starts and what is preempted is the e2e tests' (tests/e2e/test_queue.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.orm import Session

from app.core.db import make_engine
from app.core.models import Role, Run, RunStatus, utcnow
from app.core.settings import Settings
from app.launcher import processes
from app.main import create_app
from app.services import tokens, users
from app.store import queue as queue_store

PASSWORD = "queue-admin-pass"


@dataclass
class Team:
    client: TestClient
    bearer: dict[str, str]

    def as_(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.bearer[name]}"}

    def create(self, name: str, **options: Any) -> dict[str, Any]:
        answer = self.client.post("/api/runs", json={"name": f"{name}'s", "nproc_per_node": 1, **options},
                                  headers=self.as_(name))  # fmt: skip
        assert answer.status_code == 201, answer.text
        return answer.json()  # type: ignore[no-any-return]

    def get(self, run_id: int) -> dict[str, Any]:
        return self.client.get(f"/api/runs/{run_id}", headers=self.as_("admin")).json()  # type: ignore[no-any-return]

    def tick(self) -> None:
        self.client.app.state.supervisor.tick()  # type: ignore[attr-defined]


@pytest.fixture
def team(settings: Settings) -> Iterator[Team]:
    """An admin, two operators (ada, bo) and a viewer (vi), each with a token of their own."""
    settings = settings.model_copy(update={"admin_password": SecretStr(PASSWORD)})
    with TestClient(create_app(settings)) as client:
        app: Any = client.app
        bearer = {}
        with app.state.sessions() as db:
            for name, role in (("ada", Role.operator), ("bo", Role.operator), ("vi", Role.viewer)):
                users.add_user(db, name=name, role=role, password=f"{name}-password", actor="test")
            for name, role in (("admin", Role.admin), ("ada", Role.operator), ("bo", Role.operator),
                               ("vi", Role.viewer)):  # fmt: skip
                bearer[name] = tokens.create_token(db, name=f"t-{name}", role=role, expires="1d", owner=name,
                                                   actor="test").secret  # fmt: skip
        yield Team(client, bearer)


def hold_every_slot(team: Team, owner: str) -> int:
    """A run of `owner` holding both of this host's slots, its process this test's (alive to the tick); not
    preemptible, so that no tick sends a stop to this test's process group."""
    run_id = team.create(owner, nproc_per_node=2, preemptible=False)["id"]
    with team.client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.devices, run.pid = RunStatus.running, [0, 1], os.getpid()
        run.pid_start_ticks = processes.start_ticks(os.getpid())
    return int(run_id)


def test_a_run_over_its_owners_limit_waits_saying_so_and_the_queue_goes_by_priority(team: Team) -> None:
    hold_every_slot(team, "ada")
    normal = team.create("ada")["id"]
    urgent = team.create("bo", nproc_per_node=2, priority="high")["id"]
    later = team.create("ada", priority="low")["id"]
    assert team.client.put("/api/queue/limits/users/ada", json={"max_runs": 1}, headers=team.as_("admin")).is_success
    team.tick()
    said = "waiting: ada runs 1 of 1 run allowed at once"
    assert team.get(normal)["status_reason"] == said and team.get(later)["status_reason"] == said
    assert team.get(normal)["events"][-1] == {**team.get(normal)["events"][-1], "status": "queued", "reason": said}
    queue = team.client.get("/api/queue", headers=team.as_("vi")).json()
    assert [(q["id"], q["position"], q["owner"], q["priority_name"], q["over_limit"]) for q in queue["queued"]] == [
        (urgent, 1, "bo", "high", False), (normal, 2, "ada", "normal", True), (later, 3, "ada", "low", True),
    ]  # fmt: skip
    assert queue["queued"][0]["waits_for"] == "waiting for 2 CPU slots: 0 free"
    assert (queue["unit"], queue["capacity"], queue["free"]) == ("CPU slots", 2, 0)
    assert queue["owners"] == [{"owner": "ada", "slots": 2, "runs": 1, "max_slots": None, "max_runs": 1}]
    page = team.client.get("/queue", headers=team.as_("vi")).text
    assert said in page and f'id="queued-{urgent}" data-position="1"' in page

    team.tick()  # nothing changed: no second event
    assert [e["reason"] for e in team.get(normal)["events"]].count(said) == 1
    assert team.client.delete("/api/queue/limits/users/ada", headers=team.as_("admin")).json()["users"] == []
    team.tick()
    assert team.get(normal)["status_reason"] == "waiting for free process slots"  # the limit no longer holds it


def test_operators_give_priorities_up_to_the_admins_limit_and_change_them_while_the_run_waits(team: Team) -> None:
    hold_every_slot(team, "bo")
    assert team.create("ada", priority="high")["priority"] == 100
    refused = team.client.post("/api/runs", json={"name": "x", "priority": 500}, headers=team.as_("ada"))
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"][-1] == "priority"
    assert "an operator may give a priority up to high; 500 needs an admin" in refused.text
    assert team.create("admin", priority=500)["priority"] == 500
    assert team.client.post("/api/runs", json={"priority": "urgent"}, headers=team.as_("ada")).status_code == 422

    waiting = team.create("ada")["id"]
    changed = team.client.post(f"/api/runs/{waiting}/priority", json={"priority": "low"}, headers=team.as_("ada"))
    assert changed.json()["priority"] == -100
    assert changed.json()["audit"][-1]["detail"] == "normal -> low"
    assert changed.json()["audit"][-1]["actor"] == "ada (token t-ada)" and changed.json()["owner"] == "ada"
    viewer = team.client.post(f"/api/runs/{waiting}/priority", json={"priority": 1}, headers=team.as_("vi"))
    assert viewer.status_code == 403
    team.client.post(f"/api/runs/{waiting}/stop", headers=team.as_("ada"))
    late = team.client.post(f"/api/runs/{waiting}/priority", json={"priority": 5}, headers=team.as_("ada"))
    assert late.status_code == 409 and "only while the run waits" in late.json()["detail"]


def test_admins_set_limits_of_users_and_groups_and_no_one_else_reads_or_changes_them(team: Team) -> None:
    admin = team.as_("admin")
    assert team.client.get("/api/queue/limits", headers=team.as_("ada")).status_code == 403
    assert team.client.put("/api/queue/limits/users/ada", json={"max_slots": 1}, headers=team.as_("ada")).status_code \
        == 403  # fmt: skip
    team.client.put("/api/queue/limits/users/*", json={"max_slots": 4, "max_runs": 2}, headers=admin)
    group = team.client.put("/api/queue/limits/groups/vision", json={"members": ["bo", "ada", "bo"], "max_slots": 8},
                            headers=admin)  # fmt: skip
    assert group.json() == {"name": "vision", "members": ["ada", "bo"], "max_slots": 8, "max_runs": None}
    replaced = team.client.put("/api/queue/limits/groups/vision", json={"members": ["cy"]}, headers=admin).json()
    assert replaced == {"name": "vision", "members": ["cy"], "max_slots": None, "max_runs": None}
    limits = team.client.get("/api/queue/limits", headers=admin).json()
    assert limits["users"] == [{"user": "*", "max_slots": 4, "max_runs": 2}]
    assert limits["groups"] == [replaced] and limits["operator_priority_max"] == 100
    assert team.client.put("/api/queue/limits/users/a b", json={}, headers=admin).status_code == 422
    assert team.client.put("/api/queue/limits/users/ada", json={"max_runs": -1}, headers=admin).status_code == 422
    assert team.client.delete("/api/queue/limits/groups/vision", headers=admin).json()["groups"] == []
    missing = team.client.delete("/api/queue/limits/groups/vision", headers=admin)
    assert missing.status_code == 404 and "no group 'vision'" in missing.json()["detail"]
    page = team.client.get("/queue/limits", headers=admin).text
    assert 'id="limit-*"' in page and "Limits of users and groups" in page


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def ran(owner: str, slots: int, started_h: float | None, finished_h: float | None, now: datetime = NOW,
        **columns: Any) -> Run:  # fmt: skip
    """A run of `owner` on `slots` processes, started and finished so many hours before `now` (None: not)."""
    at = {name: None if hours is None else now - timedelta(hours=hours)
          for name, hours in (("started_at", started_h), ("finished_at", finished_h))}  # fmt: skip
    status = RunStatus.queued if started_h is None else RunStatus.running if finished_h is None else RunStatus.succeeded
    return Run(name=f"{owner}'s", workload="mlp", nproc_per_node=slots, owner=owner, status=status, status_reason="",
               **at, **columns)  # fmt: skip


def usage_within_a_day(sessions: Any) -> None:
    """Slot-hours from the runs' start and end times: a run that ended before the window counts not at all, one across
    its start the part inside, a live one up to now, a run's ranks (world_size) where known."""
    with sessions() as db, db.begin():
        db.add_all([ran("ada", 2, 30, 26), ran("ada", 2, 25, 23), ran("ada", 1, 1, None, world_size=4),
                    ran("bo", 8, 2, 1), ran("cy", 4, None, None)])  # fmt: skip
    with sessions() as db:
        found = queue_store.usage(db, owners=["ada", "bo", "cy", "di"], since=NOW - timedelta(hours=24), now=NOW)
    assert found == pytest.approx({"ada": 2 * 1 + 4 * 1, "bo": 8 * 1})


def test_fair_share_sums_each_owners_slot_hours_in_the_window(client: TestClient) -> None:
    usage_within_a_day(client.app.state.sessions)  # type: ignore[attr-defined]


def test_with_fair_share_the_user_who_used_least_goes_first_among_equal_priorities(settings: Settings) -> None:
    # The runs are stored before the server starts: its supervisor's first tick, in a thread of its own, then sees
    # both slots held by this test's process (zed's, not in the queue), starts nothing, and the queue keeps all three.
    engine = make_engine(settings.sqlalchemy_url)
    with Session(engine) as db, db.begin():
        held = ran("zed", 2, 0.5, None, now=utcnow(), devices=[0, 1], pid=os.getpid(), preemptible=False,
                   pid_start_ticks=processes.start_ticks(os.getpid()))  # fmt: skip
        db.add_all([held, ran("ada", 2, 3, 1, now=utcnow()), ran("ada", 2, None, None), ran("bo", 2, None, None),
                    ran("cy", 2, None, None, priority=-100)])  # fmt: skip
    engine.dispose()
    with TestClient(create_app(settings.model_copy(update={"fair_share": True}))) as client:
        order = [(q["owner"], q["position"]) for q in client.get("/api/queue").json()["queued"]]
    assert order == [("bo", 1), ("ada", 2), ("cy", 3)]  # ada came first, but held 4 CPU slot-hours today
