"""A batch's node inventory and rank heartbeat, through the ingest endpoint: kept one per host, checked field by
field."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import select

from app.core.models import RunRank
from tests.app.conftest import post


def node(host: str, *uuids: str, error: str | None = None) -> dict[str, object]:
    gpus = tuple(wire.Gpu(i, uuid, "NVIDIA H100") for i, uuid in enumerate(uuids))
    return wire.Node(host, gpus, error).to_json()


def run_gpus(client: TestClient, run_id: int) -> list[dict[str, object]]:
    return client.get(f"/api/runs/{run_id}").json()["gpus"]  # type: ignore[no-any-return]


def test_each_host_keeps_its_latest_inventory(client: TestClient, run_id: int) -> None:
    assert run_gpus(client, run_id) is None
    assert post(client, run_id, {"points": [], "node": node("b", "GPU-1")}).status_code == 200
    assert post(client, run_id, {"points": [], "node": node("a", error="NVML did not start")}).status_code == 200
    assert post(client, run_id, {"points": [], "node": node("b", "GPU-1", "GPU-2")}).status_code == 200
    assert run_gpus(client, run_id) == [node("a", error="NVML did not start"), node("b", "GPU-1", "GPU-2")]


def test_a_heartbeat_is_one_row_per_rank_holding_its_latest_step(client: TestClient, run_id: int) -> None:
    for rank, step in ((0, 5), (1, 4), (0, 6)):
        beat = {"rank": rank, "host": "node-a", "step": step}
        assert post(client, run_id, {"points": [], "heartbeat": beat}).status_code == 200
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        rows = db.execute(select(RunRank.rank, RunRank.step).where(RunRank.run_id == run_id)).all()
    assert sorted(rows) == [(0, 6), (1, 4)]


def test_a_wrong_node_or_heartbeat_is_refused_naming_the_field(client: TestClient, run_id: int) -> None:
    too_many = node("a", *(f"GPU-{i}" for i in range(wire.MAX_GPUS_PER_NODE + 1)))
    cases = [
        ({"node": too_many}, ["body", "node", "gpus"]),
        ({"node": {**node("a"), "host": ""}}, ["body", "node", "host"]),
        ({"node": {**node("a"), "host": "h" * (wire.MAX_HOST_LENGTH + 1)}}, ["body", "node", "host"]),
        ({"heartbeat": {"rank": 0, "host": "a", "step": "7"}}, ["body", "heartbeat", "step"]),
        ({"heartbeat": {"rank": -1, "host": "a", "step": 7}}, ["body", "heartbeat", "rank"]),
    ]
    for extra, loc in cases:
        response = post(client, run_id, {"points": [], **extra})
        assert response.status_code == 422, extra
        assert response.json()["detail"][0]["loc"] == loc
    assert run_gpus(client, run_id) is None


def test_nodes_reporting_at_the_same_moment_each_keep_their_inventory(client: TestClient, run_id: int) -> None:
    # Every node of a multi-node run sends its inventory on its first batch, so they land together.
    hosts = [f"node-{i}" for i in range(8)]
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        answers = list(pool.map(lambda host: post(client, run_id, {"points": [], "node": node(host, f"GPU-{host}")}),
                                hosts))  # fmt: skip
    assert [answer.status_code for answer in answers] == [200] * len(hosts)
    assert [known["host"] for known in run_gpus(client, run_id)] == hosts
