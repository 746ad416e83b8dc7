"""Deleting a run: exactly its rows and its own folders go, a live run is refused, and ingest into another run going
on meanwhile loses nothing."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import text

from app.auth.passwords import sha256 as hash_token
from app.core.models import Run, RunStatus
from app.launcher import processes
from app.schemas.metrics import BatchIn
from app.services import metrics, run_deletion

TOKEN = "delete-t0ken"
TABLES = ("run_events", "run_tags", "metric_series", "metric_summaries", "metric_recent", "audit_entries")


def live_run(client: TestClient, name: str) -> int:
    """A run as the launcher leaves it (its process: this one, so a supervisor's tick finds it alive)."""
    run_id = int(client.post("/api/runs", json={"name": name}).json()["id"])
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.token_hash = RunStatus.running, hash_token(TOKEN)
        run.pid, run.pid_start_ticks = os.getpid(), processes.start_ticks(os.getpid())
    return run_id


def send(client: TestClient, run_id: int, steps: range, keys: tuple[str, ...] = ("loss", "val_loss")) -> None:
    points = tuple(wire.Point(key, step, 1.0 / step, rank, 0.0) for key in keys for step in steps for rank in (0, 1))
    answer = client.post(f"/api/runs/{run_id}/metrics", json=wire.Batch(points).to_json(),
                         headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert answer.status_code == 200, answer.text


def finish(client: TestClient, run_id: int) -> None:
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).status = RunStatus.succeeded


def counts(client: TestClient, run_id: int) -> dict[str, int]:
    """The run's rows in each table that holds some."""
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        found = {table: db.scalar(text(f"SELECT COUNT(*) FROM {table} WHERE run_id = :r"), {"r": run_id})
                 for table in TABLES}  # fmt: skip
        series = "(SELECT id FROM metric_series WHERE run_id = :r)"
        for table in ("metric_chunks", "metric_tiers"):
            found[table] = db.scalar(text(f"SELECT COUNT(*) FROM {table} WHERE series_id IN {series}"), {"r": run_id})
        points = f"SELECT COALESCE(SUM(n), 0) FROM metric_chunks WHERE series_id IN {series}"
        found["points"] = db.scalar(text(points), {"r": run_id})
        found["runs"] = db.scalar(text("SELECT COUNT(*) FROM runs WHERE id = :r"), {"r": run_id})
        return found


def test_delete_removes_exactly_that_runs_rows_and_folders(client: TestClient, tmp_path: Path) -> None:
    shared = client.app.state.settings.shared  # type: ignore[attr-defined]
    doomed, kept = live_run(client, "doomed"), live_run(client, "kept")
    for run_id in (doomed, kept):
        send(client, run_id, range(1, 300))
        client.patch(f"/api/runs/{run_id}", json={"tags": ["t"]})
        finish(client, run_id)
    before = counts(client, kept)
    # Its folders, a neighbour whose name starts the same, and a link out of its folder to a file that must stay.
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    for folder in (f"logs/run-{doomed}", f"checkpoints/run-{doomed}", f"logs/run-{doomed}0", f"logs/run-{kept}"):
        (shared / folder).mkdir(parents=True, exist_ok=True)
        (shared / folder / "file.bin").write_bytes(b"x" * 1000)
    (shared / f"logs/run-{doomed}/link").symlink_to(outside)

    plan = client.delete(f"/api/runs/{doomed}", params={"files": "true", "dry_run": "true"}).json()
    assert plan["points"] == 2 * 299 * 2 and plan["bytes"] == 2000 and not plan["deleted"]
    assert sorted(f["path"] for f in plan["folders"]) == [f"checkpoints/run-{doomed}", f"logs/run-{doomed}"]
    assert counts(client, doomed)["points"] == plan["points"]  # a dry run deletes nothing

    done = client.delete(f"/api/runs/{doomed}", params={"files": "true"})
    assert done.status_code == 200 and done.json()["deleted"]
    assert set(counts(client, doomed).values()) == {0}
    assert counts(client, kept) == before
    assert not (shared / f"logs/run-{doomed}").exists() and not (shared / f"checkpoints/run-{doomed}").exists()
    assert (shared / f"logs/run-{doomed}0/file.bin").exists() and (shared / f"logs/run-{kept}/file.bin").exists()
    assert outside.read_text() == "keep me"
    assert client.get(f"/api/runs/{doomed}").status_code == 404
    assert [run["id"] for run in client.get("/api/runs").json()["items"]] == [kept]


def test_a_live_run_is_not_deleted(client: TestClient) -> None:
    run_id = live_run(client, "alive")
    send(client, run_id, range(1, 10))
    before = counts(client, run_id)
    answer = client.delete(f"/api/runs/{run_id}", params={"files": "true"})
    assert answer.status_code == 409 and "stop it before deleting it" in answer.json()["detail"]
    assert counts(client, run_id) == before
    page = client.post(f"/runs/{run_id}/delete", data={"files": "true"})
    assert page.status_code == 409 and counts(client, run_id) == before


def test_ingest_into_another_run_loses_nothing_while_a_run_is_deleted(client: TestClient) -> None:
    app = client.app
    doomed, busy = live_run(client, "doomed"), live_run(client, "busy")
    for start in range(1, 4001, 1000):
        send(client, doomed, range(start, start + 1000), keys=("loss",))
    finish(client, doomed)
    stop = threading.Event()
    sent: list[int] = []
    errors: list[BaseException] = []

    def ingest() -> None:
        step = 1
        try:
            while not stop.is_set() or step < 200:
                points = tuple(wire.Point("loss", s, 0.5, 0, 0.0) for s in range(step, step + 20))
                batch = BatchIn.model_validate(wire.Batch(points).to_json())
                with app.state.sessions() as db:  # type: ignore[attr-defined]
                    metrics.ingest(db, run_id=busy, token=TOKEN, batch=batch)
                sent.extend(range(step, step + 20))
                step += 20
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=ingest)
    thread.start()
    try:
        with app.state.sessions() as db:  # type: ignore[attr-defined]
            run_deletion.delete_run(
                db, run_id=doomed, folders=app.state.folders, files=False, actor="test", batch=500
            )  # fmt: skip
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors
    stored = client.get(f"/api/runs/{busy}/metrics/loss", params={"limit": 100_000}).json()["points"]
    assert [p["step"] for p in stored] == sent and len(sent) >= 200
    assert set(counts(client, doomed).values()) == {0}


@pytest.mark.parametrize("status", [RunStatus.queued, RunStatus.stopping])
def test_bulk_delete_refuses_unfinished_runs_and_deletes_the_rest(client: TestClient, status: RunStatus) -> None:
    waiting, done = live_run(client, "waiting"), live_run(client, "done")
    finish(client, done)
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, waiting).status = status
    answer = client.post("/api/runs/bulk", json={"runs": [waiting, done], "action": "delete"}).json()
    assert answer["done"] == [done] and "stop it before deleting it" in answer["refused"][str(waiting)]
    assert counts(client, waiting)["runs"] == 1 and counts(client, done)["runs"] == 0
