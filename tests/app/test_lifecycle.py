"""A run's status has one writer, `transitions.move`, and a table of the moves it allows: an end is left only through
the queue (Resume, or a requeue), and each move leaves an event that says why."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import func, select, update

from app.core.errors import RunNotActive
from app.core.models import Run, RunEvent, RunStatus, utcnow
from app.services.lifecycle import transitions
from tests.app.conftest import post

# The rule book, as a person reads it: from each status (or a run being made), where a run may go. A stopping run
# goes back to the queue when it stopped for a higher-priority run (preempted, to resume).
ALLOWED = """
    new       -> queued starting
    queued    -> queued starting running stopping succeeded failed stopped lost
    starting  -> queued starting running stopping succeeded failed stopped lost
    running   -> queued running stopping succeeded failed stopped lost
    stopping  -> queued stopping succeeded failed stopped lost
    succeeded -> queued
    failed    -> queued
    stopped   -> queued
    lost      -> queued
"""


def allowed_moves() -> set[tuple[str, str]]:
    moves = set()
    for line in ALLOWED.strip().splitlines():
        start, _arrow, *ends = line.split()
        moves |= {(start, end) for end in ends}
    return moves


def try_move(client: TestClient, run_id: int | None, start: RunStatus | None, end: RunStatus) -> bool:
    """Puts a run in `start` (made anew for None) and asks for `end`; whether the table let it, checked on the way:
    a move changes the status and reason and adds an event, a refusal leaves all three as they were."""
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        before = db.scalar(select(func.count()).select_from(RunEvent)) or 0
        if run_id is None:
            run = Run(name="new", workload="mlp", nproc_per_node=1, created_by="test")
            db.add(run)
        else:
            db.execute(update(Run).where(Run.id == run_id).values(status=start, status_reason="arranged"))
            run = db.get(Run, run_id)
        try:
            transitions.move(db, run, end, f"to {end.value}")
        except RunNotActive as refused:
            assert (run.status, run.status_reason) == (start, "arranged" if start else None)
            assert f"cannot become {end.value}" in refused.message
            moved = False
        else:
            assert (run.status, run.status_reason) == (end, f"to {end.value}")
            moved = True
        if moved:
            db.flush()
        with db.no_autoflush:  # a refused new run has no status to be stored with: it stays unsaved
            assert (db.scalar(select(func.count()).select_from(RunEvent)) or 0) == before + moved
        if not moved:
            db.rollback()
    return moved


def test_a_run_moves_exactly_as_the_table_allows_and_every_other_move_is_refused(client: TestClient) -> None:
    run_id = int(client.post("/api/runs", json={"name": "moved"}).json()["id"])
    made = {("new", end.value) for end in RunStatus if try_move(client, None, None, end)}
    moved = {
        (start.value, end.value) for start in RunStatus for end in RunStatus if try_move(client, run_id, start, end)
    }
    assert made | moved == allowed_moves()


def test_an_ended_run_is_left_only_by_resume_and_the_tick_or_a_late_report_cannot_revive_it(client: TestClient) -> None:
    run_id = int(client.post("/api/runs", json={"name": "ended"}).json()["id"])
    assert client.post(f"/api/runs/{run_id}/stop").json()["status"] == "stopped"
    client.app.state.supervisor.tick()  # type: ignore[attr-defined]
    assert client.get(f"/api/runs/{run_id}").json()["status"] == "stopped"
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        with pytest.raises(RunNotActive, match="stopped: it cannot become running"):
            transitions.move(db, run, RunStatus.running, "the trainer reported its first step")


def test_a_lost_run_launched_elsewhere_comes_back_through_the_queue_when_it_reports_again(
    client: TestClient,
) -> None:
    body = {"key": "torchrun:cut-off", "name": "cut off", "rank": 0, "world_size": 1, "local_world_size": 1,
            "host": "node-a"}  # fmt: skip
    joined = client.post("/api/runs/external", json=body).json()
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.execute(update(Run).where(Run.id == joined["run_id"]).values(contact_at=utcnow() - timedelta(hours=1)))
    client.app.state.supervisor.tick()  # type: ignore[attr-defined]
    post(client, joined["run_id"], wire.Batch((wire.Point("loss", 5, 0.5),)).to_json(), token=joined["token"])
    shown = client.get(f"/api/runs/{joined['run_id']}").json()
    said = [(event["status"], event["reason"]) for event in shown["events"]]
    assert [status for status, _reason in said] == ["starting", "lost", "queued", "running"]
    assert said[2][1] == "its processes report again: the silence was not their end"
    assert shown["status"] == "running" and shown["finished_at"] is None


def test_a_job_launched_elsewhere_that_rejoins_after_its_end_is_requeued_as_its_next_attempt(
    client: TestClient,
) -> None:
    body = {"key": "slurm:c1:77", "name": "requeued", "rank": 0, "world_size": 1, "local_world_size": 1,
            "host": "node-a"}  # fmt: skip
    first = client.post("/api/runs/external", json=body).json()
    ended = wire.Batch(ended=wire.Ended(0, "node-a", "failed", "RuntimeError: NCCL timeout")).to_json()
    post(client, first["run_id"], ended, token=first["token"])
    client.post("/api/runs/external", json={**body, "host": "node-b"})
    shown = client.get(f"/api/runs/{first['run_id']}").json()
    said = [(event["status"], event["reason"]) for event in shown["events"]][-2:]
    assert said == [
        ("queued", "attempt 2: its job was restarted where it runs"),
        ("starting", "attempt 2: rank 0 on node-b joined again"),
    ]


def test_what_a_run_launched_elsewhere_is_offered_is_its_launchers_word_on_the_page_and_in_the_api(
    client: TestClient,
) -> None:
    body = {"key": "k8s:job-9", "name": "elsewhere", "rank": 0, "world_size": 1, "local_world_size": 1,
            "host": "node-a"}  # fmt: skip
    joined = client.post("/api/runs/external", json=body).json()
    ended = wire.Batch(ended=wire.Ended(0, "node-a", "failed", "RuntimeError: NCCL timeout")).to_json()
    post(client, joined["run_id"], ended, token=joined["token"])
    run_id = joined["run_id"]
    page = client.get(f"/runs/{run_id}").text
    assert f'action="/runs/{run_id}/resume"' not in page and 'id="desync-button"' not in page
    assert 'id="sweep"' not in page and 'id="external-job"' in page and 'id="slurm-job"' not in page
    desync = client.post(f"/api/runs/{run_id}/desync")
    assert desync.status_code == 409 and "rerun it there with TORCH_DISTRIBUTED_DEBUG=DETAIL" in desync.text
    sweep = client.post(f"/api/runs/{run_id}/sweep")
    assert sweep.status_code == 422 and "this run was launched elsewhere" in sweep.text

    local = int(client.post("/api/runs", json={"name": "here"}).json()["id"])
    client.post(f"/api/runs/{local}/stop")
    page = client.get(f"/runs/{local}").text
    assert 'id="sweep"' in page and 'id="desync-button"' in page and 'id="external-job"' not in page
