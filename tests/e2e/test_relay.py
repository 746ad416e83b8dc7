"""One post per node (rankboard.relay), end to end: a real 4-rank torchrun (gloo) whose local rank 0 relays its
node's batches. The server takes about one post an interval where four ranks made several; and still a rank that
hangs goes silent on the health, every rank answers the dump, and stop reaches every rank."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rankboard import wire

from tests.e2e.runs import FINAL, create, wait_status, worker_pid
from tests.e2e.test_forensics import complete_dump, training
from tests.live import LiveServer, run_processes, serving, wait_for

pytestmark = pytest.mark.e2e
RANKS = 4
WINDOW_S = 6.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serving(tmp_path_factory.mktemp("relay"), RANKBOARD_SLOTS=str(RANKS), RANKBOARD_STOP_GRACE_S="3",
                 RANKBOARD_STALL_AFTER_S="4", RANKBOARD_PROMETHEUS="1",
                 **{wire.ENV_TEST_FAULT: "hang:rank=2:step=150"}) as server:  # fmt: skip
        yield server


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serving(tmp_path_factory.mktemp("relay-plain"), RANKBOARD_SLOTS="2", RANKBOARD_STOP_GRACE_S="3",
                 RANKBOARD_STALL_AFTER_S="4") as server:  # fmt: skip
        yield server


def batches_taken(api: httpx.Client) -> float:
    scraped = text_string_to_metric_families(api.get("/metrics").text)
    return next(f.samples[0].value for f in scraped if f.name == "rankboard_ingest_batches")


def posts_in(api: httpx.Client, seconds: float) -> tuple[float, float]:
    """The batches the server took over about `seconds`, and the seconds it really was."""
    before, started = batches_taken(api), time.monotonic()
    time.sleep(seconds)
    return batches_taken(api) - before, time.monotonic() - started


def stalled_ranks(api: httpx.Client, run_id: int) -> list[int] | None:
    health = api.get(f"/api/runs/{run_id}/health").json()
    return sorted(rank["rank"] for rank in health["stalled"]) if health["state"] != "ok" else None


def test_a_node_of_four_ranks_posts_once_an_interval_and_its_hung_rank_is_still_found(server: LiveServer) -> None:
    with server.api() as api:
        run = create(api, workload="mlp", epochs=1, batch_size=32, nproc_per_node=RANKS, pg_timeout_s=30)
        wait_for(lambda: training(api, run["id"]), 120, interval=0.3, what="the run to train")
        # Each rank posting for itself makes ~2.5 posts a second here (rank 0's points every second, each other
        # rank's heartbeat and goodput every two); the node's relay makes one each interval (1 s), whether the ranks
        # train or wait for the hung one.
        # A rank's reporter starved of the CPU (4 ranks on this 2-core machine) now and then misses the relay's
        # window and gets a post of its own: 5 to 7 in 6 s here, against 15 without the relay.
        posts, seconds = posts_in(api, WINDOW_S)
        assert posts <= 1.5 * seconds / 1.0 + 1, (posts, seconds)
        ranks = wait_for(lambda: api.get(f"/api/runs/{run['id']}/ranks").json(), 30, what="the ranks' heartbeats")
        assert {row["rank"] for row in ranks} == set(range(RANKS))  # every rank's heartbeat, through the relay
        # Rank 2 hangs: its silence shows as it does without a relay (nothing speaks for a silent rank), then the
        # others' as they wait for it in the all-reduce.
        assert wait_for(lambda: stalled_ranks(api, run["id"]), 90, interval=0.5, what="a stall") is not None
        dump = wait_for(lambda: complete_dump(api, run["id"]), 90, interval=0.5, what="every rank's dump")
        assert sorted(rank["rank"] for rank in dump["ranks"]) == list(range(RANKS))
        assert dump["culprits"] == [2], dump["verdict"]
        assert "not progressing" in " ".join(
            event["reason"] for event in api.get(f"/api/runs/{run['id']}").json()["events"]
        )
        api.post(f"/api/runs/{run['id']}/stop")
        done = wait_status(api, run["id"], FINAL, timeout=60)
    assert done["status"] == "stopped", done["status_reason"]
    wait_for(lambda: not run_processes(server.root), 30, what="every rank to exit")


def test_a_frozen_rank_beside_the_relay_goes_silent_and_is_the_one_that_does_not_answer(plain: LiveServer) -> None:
    """Local rank 1 stopped whole (SIGSTOP: its reporter too, as a rank the OOM killer is about to take): the relay
    speaks for no silent rank, so its heartbeat stops, and the dump that the stall asks for is answered by every
    rank but that one."""
    with plain.api() as api:
        run = create(api, workload="mlp", epochs=100, batch_size=32, nproc_per_node=2, pg_timeout_s=60)
        wait_for(lambda: training(api, run["id"]), 120, interval=0.3, what="the run to train")
        frozen = worker_pid(plain, local_rank=1)
        os.kill(frozen, signal.SIGSTOP)
        try:
            assert wait_for(lambda: stalled_ranks(api, run["id"]), 60, interval=0.5, what="a stall") is not None

            def answered_but_one() -> dict | None:
                dump = api.get(f"/api/runs/{run['id']}/dumps").json()["latest"]
                return dump if dump and 0 in {rank["rank"] for rank in dump["ranks"]} else None

            dump = wait_for(answered_but_one, 60, interval=0.5, what="rank 0's answer to the stall's dump")
            assert dump["missing"] == [1], dump
        finally:
            os.kill(frozen, signal.SIGKILL)
        done = wait_status(api, run["id"], FINAL, timeout=60)
    assert done["status"] == "failed", done["status_reason"]
    wait_for(lambda: not run_processes(plain.root), 30, what="every rank to exit")
