"""Fixtures of the API tests: a run in the state the launcher leaves it, and helpers to post to and read it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.models import Run, RunStatus
from app.services.runs import hash_token
from trainer import wire

TOKEN = "t0ken-for-tests"


@pytest.fixture
def run_id(client: TestClient) -> int:
    """A run as the launcher leaves it once torchrun is up: `running`, holding the hash of its token.

    (The launch itself, which makes the token, is tested end to end with a real torchrun.)
    """
    run_id = int(client.post("/api/runs", json={"name": "ingest"}).json()["id"])
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.token_hash = RunStatus.running, hash_token(TOKEN)
    return run_id


def post(client: TestClient, run_id: int, body: object, token: str = TOKEN):  # type: ignore[no-untyped-def]
    return client.post(f"/api/runs/{run_id}/metrics", json=body, headers={"Authorization": f"Bearer {token}"})


def series(client: TestClient, run_id: int, key: str = "loss") -> list[tuple[int, int, float]]:
    points = client.get(f"/api/runs/{run_id}/metrics/{key}").json()["points"]
    return [(p["step"], p["rank"], wire.decode_value(p["value"])) for p in points]


def batch(*steps: int, key: str = "loss") -> dict:
    return wire.Batch(tuple(wire.Point(key, s, 1.0 / s, 0, 1.7e9 + s) for s in steps)).to_json()
