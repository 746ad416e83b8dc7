"""A node's relayed batch through the ingest endpoint (rankboard.relay): several ranks' heartbeats and endings in one
post, each kept as if its rank had posted it alone; an older client's singular fields still taken."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import select

from app.core.models import RunRank
from tests.app.conftest import post, running_run
from tests.app.test_external import join, run
from tests.app.test_external import post as post_joined
from tests.app.test_postgres import admin_dsn, pg_client  # noqa: F401  (fixtures)
from tests.postgres import postgres_bin


def rank_steps(client: TestClient, run_id: int) -> list[tuple[int, str, int]]:
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        rows = db.execute(select(RunRank.rank, RunRank.host, RunRank.step).where(RunRank.run_id == run_id)).all()
    return sorted((rank, host, step) for rank, host, step in rows)


def beats(*steps: tuple[int, int], host: str = "node-a") -> list[dict[str, Any]]:
    return [{"rank": rank, "host": host, "step": step} for rank, step in steps]


def test_a_relayed_batch_keeps_each_ranks_heartbeat_as_if_each_had_posted(client: TestClient, run_id: int) -> None:
    relayed = wire.Batch(heartbeats=tuple(wire.Heartbeat(rank, "node-a", 10 + rank) for rank in range(8)))
    assert post(client, run_id, relayed.to_json()).status_code == 200
    assert rank_steps(client, run_id) == [(rank, "node-a", 10 + rank) for rank in range(8)]
    # Later ones replace earlier ones; the singular field (an older client's, or one rank on its own) rides along,
    # and a rank named twice in one batch keeps the last word.
    body = {"points": [], "heartbeats": beats((1, 20), (2, 21), (1, 22)), "heartbeat": beats((7, 30), host="b")[0]}
    assert post(client, run_id, body).status_code == 200
    expected = {rank: (rank, "node-a", 10 + rank) for rank in range(8)} | {1: (1, "node-a", 22), 2: (2, "node-a", 21)}
    assert rank_steps(client, run_id) == sorted((expected | {7: (7, "b", 30)}).values())


def test_a_batch_with_more_heartbeats_than_a_node_has_ranks_is_refused(client: TestClient, run_id: int) -> None:
    body = {"points": [], "heartbeats": beats(*((rank, 1) for rank in range(wire.MAX_RANKS_PER_BATCH + 1)))}
    answer = post(client, run_id, body)
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "heartbeats"]
    body = {"points": [], "heartbeats": beats((0, "seven"))}  # type: ignore[arg-type]
    answer = post(client, run_id, body)
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"][:3] == ["body", "heartbeats", 0]
    assert rank_steps(client, run_id) == []


def test_the_endings_of_a_nodes_ranks_in_one_post_end_the_run(client: TestClient) -> None:
    first, _second = join(client, rank=0), join(client, rank=1)
    both = wire.Batch(endings=(wire.Ended(0, "node-a", "finished"), wire.Ended(1, "node-a", "exited")))
    post_joined(client, first, both.to_json())
    done = run(client, first["run_id"])
    assert done["status"] == "succeeded" and done["status_reason"] == "training finished: all 2 ranks ended"
    # One of them failing fails the run, whichever field carries it.
    third, _fourth = join(client, rank=0, key="k8s:job-9"), join(client, rank=1, key="k8s:job-9")
    mixed = wire.Batch(endings=(wire.Ended(1, "node-a", "failed", "ValueError: bad shape"),),
                       ended=wire.Ended(0, "node-a", "exited"))  # fmt: skip
    post_joined(client, third, mixed.to_json())
    failed = run(client, third["run_id"])
    assert failed["status"] == "failed" and failed["status_reason"] == "rank 1 on node-a raised ValueError: bad shape"


@pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL is not installed (scripts/test installs it)")
def test_a_relayed_batch_keeps_each_ranks_heartbeat_on_postgresql(pg_client: TestClient) -> None:  # noqa: F811
    test_a_relayed_batch_keeps_each_ranks_heartbeat_as_if_each_had_posted(pg_client, running_run(pg_client))
