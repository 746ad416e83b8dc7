"""Which rank, and why, end to end: a real 2-rank torchrun (gloo) in which rank 1 stops before an all-reduce; the
run is flagged not progressing, every rank's dump arrives unasked, and the page and the API name rank 1 with its
stack line while rank 0 waits in all_reduce. Once for the built-in trainer, once for a user's script."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.runs import FINAL, create, wait_status
from tests.live import LiveServer, serving, wait_for
from trainer import wire

pytestmark = pytest.mark.e2e
HANG_SCRIPT = Path(__file__).with_name("hang_script.py")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("forensics")
    with serving(root, RANKBOARD_SLOTS="2", RANKBOARD_STOP_GRACE_S="3", RANKBOARD_STALL_AFTER_S="4",
                 **{wire.ENV_TEST_FAULT: "hang:rank=1:step=30"}) as server:  # fmt: skip
        yield server


def complete_dump(api: httpx.Client, run_id: int) -> dict | None:
    """The newest dump once both ranks answered it; fails at once if the run ended first."""
    run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] not in FINAL, (run["status"], run["status_reason"])
    dump = api.get(f"/api/runs/{run_id}/dumps").json()["latest"]
    return dump if dump and not dump["missing"] else None


def assert_rank_1_named(api: httpx.Client, run_id: int, stack_line: str) -> None:
    dump = wait_for(lambda: complete_dump(api, run_id), 90, interval=0.5, what="both ranks' dumps")
    ranks = {rank["rank"]: rank for rank in dump["ranks"]}
    assert dump["culprits"] == [1], dump["verdict"]
    assert dump["verdict"].startswith("rank 1 never reached all_reduce #"), dump["verdict"]
    assert "that rank 0 waits in" in dump["verdict"] and stack_line in dump["verdict"], dump["verdict"]
    assert ranks[0]["collective"] == "all_reduce" and ranks[1]["collective"] is None
    assert ranks[1]["last_seq"] < ranks[0]["last_seq"]
    assert stack_line in ranks[1]["where"] and "Thread 0x" in ranks[1]["threads"]
    page = api.get(f"/runs/{run_id}").text
    assert 'data-culprits="1"' in page and "rank 1 never reached all_reduce" in page
    assert '<tr data-rank="0">' in page and "<td>all_reduce</td>" in page
    run = api.get(f"/api/runs/{run_id}").json()
    assert "not progressing" in " ".join(event["reason"] for event in run["events"])
    api.post(f"/api/runs/{run_id}/stop")
    wait_status(api, run_id, FINAL, timeout=60)


def test_the_built_in_trainer_hung_by_one_rank_is_dumped_and_that_rank_named(server: LiveServer) -> None:
    with server.api() as api:
        run = create(api, workload="mlp", epochs=1, batch_size=32, pg_timeout_s=10)
        assert_rank_1_named(api, run["id"], "forensics.py")  # rank 1 waits in hang_forever, outside any collective
        # Re-run with desync checks: the copy hangs the same way, and its failure explanation names rank 1.
        page = api.get(f"/runs/{run['id']}").text
        assert 'id="desync-button"' in page
        copy = api.post(f"/api/runs/{run['id']}/desync")
        assert copy.status_code == 201, copy.text
        assert (copy.json()["desync_checks"], copy.json()["pg_timeout_s"]) == (True, 10)
        done = wait_status(api, copy.json()["id"], FINAL, timeout=120)
        found = api.get(f"/api/runs/{copy.json()['id']}/diagnoses").json()
    assert done["status"] == "failed", done["status_reason"]
    desync = next((d for d in found if d["kind"] == "desync"), None)
    assert desync is not None and "Rank 1 failed to pass monitoredBarrier" in desync["line"], found


def test_a_user_script_hung_by_one_rank_is_dumped_through_the_client_alone(server: LiveServer) -> None:
    shutil.copy(HANG_SCRIPT, server.root / "shared" / "hang_script.py")
    with server.api() as api:
        run = create(api, script="hang_script.py")
        assert_rank_1_named(api, run["id"], "hang_script.py:13 in wait_for_data")
