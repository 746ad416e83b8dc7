"""Stragglers, end to end with a real 2-rank torchrun (gloo): a rank whose data loading is made 40 ms slower is
flagged "data wait" on its node, on the page and in the health API, while the run goes on; an even run is never
flagged, over its whole length, and its replicas' fingerprints always agree."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from rankboard import wire

from tests.e2e.runs import FINAL, create, wait_status
from tests.live import LiveServer, serving, wait_for

pytestmark = pytest.mark.e2e
RUN = {"workload": "mlp", "epochs": 2, "batch_size": 256}  # 128 steps an epoch: 12 reports of each rank's times


def serve(root_factory: pytest.TempPathFactory, name: str, **env: str) -> Iterator[LiveServer]:
    with serving(root_factory.mktemp(name), RANKBOARD_SLOTS="2", RANKBOARD_STOP_GRACE_S="5", **env) as server:
        yield server


@pytest.fixture(scope="module")
def slowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from serve(tmp_path_factory, "slowed", **{wire.ENV_TEST_FAULT: "slow_data:rank=1:step=1:ms=40"})


@pytest.fixture(scope="module")
def even(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from serve(tmp_path_factory, "even")


def flagged(api: httpx.Client, run_id: int) -> list[dict] | None:
    """The health API's stragglers once there is one; fails at once if the run ended first."""
    run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] not in FINAL, (run["status"], run["status_reason"])
    stragglers = api.get(f"/api/runs/{run_id}/health").json()["stragglers"]
    return stragglers or None


def test_a_rank_slow_to_load_its_data_is_flagged_data_wait_on_its_node(slowed: LiveServer) -> None:
    with slowed.api() as api:
        run = create(api, **RUN)
        (straggler,) = wait_for(lambda: flagged(api, run["id"]), 120, interval=0.3, what="a straggler")
        page = api.get(f"/runs/{run['id']}").text
        done = wait_status(api, run["id"], FINAL, timeout=120)
        found = api.get(f"/api/runs/{run['id']}/findings").json()["stragglers"]
    assert (straggler["rank"], straggler["part"], straggler["ongoing"]) == (1, "data wait", True)
    assert straggler["ms"] - straggler["others_ms"] > 30, straggler
    assert straggler["since_step"] == wire.RANK_TIMES_EVERY  # from its first report: it was slow from the start
    host = straggler["host"]
    assert host and f"rank 1 on {host} is slow in data wait" in straggler["sentence"]
    assert '<li data-rank="1" data-part="data wait" class="ongoing">' in page and "Straggler:" in page
    assert done["status"] == "succeeded", done["status_reason"]
    assert [(s["rank"], s["part"]) for s in found] == [(1, "data wait")]  # still told once the run ended


def test_an_even_run_is_never_flagged(even: LiveServer) -> None:
    with even.api() as api:
        run = create(api, **RUN)
        done = wait_status(api, run["id"], FINAL, timeout=180)
        assert done["status"] == "succeeded", done["status_reason"]
        times = api.get(f"/api/runs/{run['id']}/metrics/rank/data_ms").json()["points"]
        found = api.get(f"/api/runs/{run['id']}/findings").json()
    assert len(times) == 2 * (2 * 128 // wire.RANK_TIMES_EVERY)  # every report of both ranks was there to judge
    assert found["stragglers"] == [], found  # episodes over the whole run, past ones included
    assert found["divergence"] is None  # its replicas were compared at steps 100 and 200, and agreed
