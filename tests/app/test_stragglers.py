"""Stragglers among many ranks, as the ranks report their step times (wire.RANK_TIME_KEYS, relayed by each node):
the slow rank is named against the median of the others, whether they are an odd or an even number."""

from __future__ import annotations

from fastapi.testclient import TestClient
from rankboard import wire

from app.core.models import Run
from tests.app.conftest import post, running_run

STEP_MS, DATA_MS, COMPUTE_MS = wire.RANK_TIME_KEYS[:3]


def reported(client: TestClient, data_ms: list[float], reports: int = 4) -> list[str]:
    """The straggler sentences of a run whose ranks waited `data_ms[rank]` for their data at each of `reports`
    reports (one a second, ending now)."""
    run_id = running_run(client)
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).nproc_per_node = len(data_ms)  # type: ignore[union-attr]
    for report in range(1, reports + 1):  # a batch a report: a thousand ranks' reports fill one
        points = tuple(
            wire.Point(key, 20 * report, value, rank, 1.7e9 + report)
            for rank, waited in enumerate(data_ms)
            for key, value in ((STEP_MS, 100.0), (DATA_MS, waited), (COMPUTE_MS, 100.0 - waited))
        )
        assert post(client, run_id, wire.Batch(points).to_json()).status_code == 200
    return [s["sentence"] for s in client.get(f"/api/runs/{run_id}/health").json()["stragglers"]]


def test_a_slow_rank_is_named_against_the_middle_of_an_even_number_of_others(client: TestClient) -> None:
    # The others wait 2, 4, 6 and 8 ms: their median is 5 ms, halfway between the two in the middle.
    assert reported(client, [2.0, 4.0, 6.0, 50.0, 8.0]) == [
        "rank 3 on an unknown node is slow in data wait: 50 ms a step against the others' 5 ms, since step 20 (still)"
    ]


def test_a_slow_rank_is_named_against_the_middle_of_an_odd_number_of_others(client: TestClient) -> None:
    assert reported(client, [2.0, 9.0, 50.0, 4.0]) == [
        "rank 2 on an unknown node is slow in data wait: 50 ms a step against the others' 4 ms, since step 20 (still)"
    ]


def test_one_slow_rank_among_a_thousand_is_the_only_one_named(client: TestClient) -> None:
    waits = [5.0 + rank % 3 for rank in range(1024)]
    waits[517] = 60.0
    assert reported(client, waits) == [
        "rank 517 on an unknown node is slow in data wait: 60 ms a step against the others' 6 ms, since step 20 (still)"
    ]


def test_ranks_that_wait_alike_name_no_straggler(client: TestClient) -> None:
    assert reported(client, [5.0, 5.0, 5.0, 5.0, 5.0, 5.0]) == []
