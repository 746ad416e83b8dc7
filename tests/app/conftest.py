"""Fixtures of the API tests: a run in the state the launcher leaves it, and helpers to post to and read it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from rankboard import wire

from app.auth.passwords import sha256 as hash_token
from app.core.models import Run, RunStatus, utcnow
from app.services.lifecycle import transitions

TOKEN = "t0ken-for-tests"


@pytest.fixture
def run_id(client: TestClient) -> int:
    return running_run(client)


def running_run(client: TestClient, name: str = "ingest") -> int:
    """A run as the launcher leaves it once torchrun is up: `running`, holding the hash of TOKEN.

    (The launch itself, which makes the token, is tested end to end with a real torchrun.)
    """
    run_id = int(client.post("/api/runs", json={"name": name}).json()["id"])
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.token_hash = RunStatus.running, hash_token(TOKEN)
    return run_id


def move_run(client: TestClient, run_id: int, status: RunStatus) -> None:
    """Moves the run to `status` as the server does: an event for the move, and an end time once it is over (so
    that what a page shows of a finished run, such as its wall time, stays as it was)."""
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.finished_at = utcnow() if status.is_final else None
        if run.status.is_final and status != RunStatus.queued:  # an end is left only through the queue (a resume)
            transitions.move(db, run, RunStatus.queued, "resumed by the test")
        transitions.move(db, run, status, f"moved to {status.value} by the test")


def post(client: TestClient, run_id: int, body: object, token: str = TOKEN):  # type: ignore[no-untyped-def]
    return client.post(f"/api/runs/{run_id}/metrics", json=body, headers={"Authorization": f"Bearer {token}"})


def series(client: TestClient, run_id: int, key: str = "loss") -> list[tuple[int, int, float]]:
    """The series' points; none when the run never reported the key (a 404 naming it)."""
    answer = client.get(f"/api/runs/{run_id}/metrics/{key}")
    if answer.status_code == 404 and f"has no metric {key!r}" in answer.json()["detail"]:
        return []
    points = answer.json()["points"]
    return [(p["step"], p["rank"], wire.decode_value(p["value"])) for p in points]


def batch(*steps: int, key: str = "loss") -> dict:
    return wire.Batch(tuple(wire.Point(key, s, 1.0 / s, 0, 1.7e9 + s) for s in steps)).to_json()


def read_all_pages(client: TestClient, run_id: int, key: str, *, limit: int) -> list[tuple[int, int]]:
    """Every (step, rank) of a series, following the pages' cursor (next_step, next_rank) to the end.

    A cursor must move on every page: one that comes back unchanged would page for ever, which fails the test here.
    """
    got: list[tuple[int, int]] = []
    cursor: tuple[int, int] | None = (0, 0)
    while cursor is not None:
        params = {"start_step": cursor[0], "start_rank": cursor[1], "limit": limit}
        page = client.get(f"/api/runs/{run_id}/metrics/{key}", params=params).json()
        got += [(p["step"], p["rank"]) for p in page["points"]]
        following = None if page["next_step"] is None else (page["next_step"], page["next_rank"])
        assert following is None or following > cursor, f"the page at {cursor} (limit {limit}) did not move on"
        cursor = following
    return got


def ranks_at_each_step(steps: range, ranks: int, key: str = "rank/step_ms") -> dict:
    """A batch of one point per rank at each step, as rank 0 relays the ranks' step times."""
    points = tuple(wire.Point(key, s, 10.0 * s + r, r, 1.7e9 + s) for s in steps for r in range(ranks))
    return wire.Batch(points).to_json()
