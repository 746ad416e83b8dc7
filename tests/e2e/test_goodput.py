"""Goodput of a real 2-rank gloo run under a real server: a rank killed and restarted, a checkpoint every epoch, and a
stop. The parts must add up to wall time x processes (measured here from the run's own timestamps), and the steps the
restarted workers took again must be counted lost. One run, shared by the module's tests."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from app.launcher import processes
from tests.e2e.runs import FINAL, create, output, wait_status, worker_pid
from tests.live import LiveServer, run_processes, wait_for

pytestmark = pytest.mark.e2e

# Small batches: 2,048 steps an epoch per rank, several seconds here, so the kill lands in epoch 2 well after its
# first checkpoint, and the stop later in the same epoch, after the restart. (At 1,024 a loaded machine, whose reported
# step lags the ranks' by up to a report interval, once saw the run finish before the stop reached it.)
OPTIONS: dict[str, Any] = {"workload": "mlp", "epochs": 2, "batch_size": 16, "seed": 3, "checkpoint_every": 1,
                           "checkpoint_unit": "epoch", "max_restarts": 1}  # fmt: skip
STEPS_PER_EPOCH = 2048
ODD_GPU = "1:gpu=NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("goodput")
    # Rank 1 claims another GPU: preflight (in its default "warn" mode) names it, and the run goes on.
    live = LiveServer(root, RANKBOARD_STOP_GRACE_S="30", RANKBOARD_SLOTS="2", RANKBOARD_PREFLIGHT_OVERRIDE=ODD_GPU)
    live.start()
    yield live
    live.stop()
    processes.kill_all(run_processes(root))


def step_of(server: LiveServer, run_id: int) -> int:
    with server.api() as api:
        return int(api.get(f"/api/runs/{run_id}").json()["step"])


@pytest.fixture(scope="module")
def finished(server: LiveServer) -> dict[str, Any]:
    """The run, killed once in epoch 2, restarted from the epoch-1 checkpoint, stopped later in epoch 2; its goodput."""
    with server.api() as api:
        run = create(api, name="goodput kill and stop", **OPTIONS)
        run_id = run["id"]
        wait_for(lambda: step_of(server, run_id) > STEPS_PER_EPOCH + 300, 180, what="epoch 2 well under way")
        killed_at = step_of(server, run_id)
        os.kill(worker_pid(server, local_rank=1), signal.SIGKILL)
        wait_for(lambda: api.get(f"/api/runs/{run_id}").json()["restarts"] == 1, 60, what="the restart")
        wait_for(lambda: step_of(server, run_id) > killed_at + 300, 240, what="the restarted workers past the kill")
        api.post(f"/api/runs/{run_id}/stop").raise_for_status()
        done = wait_status(api, run_id, FINAL, timeout=120)
        assert done["status"] == "stopped", (done["status_reason"], output(server, run_id))
        goodput = api.get(f"/api/runs/{run_id}/goodput").json()
        page = api.get(f"/runs/{run_id}").text
        comm = api.get(f"/api/runs/{run_id}/comm").json()
        checked = api.get(f"/api/runs/{run_id}/preflight").json()
        flops = api.get(f"/api/runs/{run_id}/mfu").json()
        exposed = api.get(f"/api/runs/{run_id}/metrics/rank/comm_ms", params={"limit": 100_000}).json()["points"]
    return {
        "run": done,
        "goodput": goodput,
        "killed_at": killed_at,
        "page": page,
        "comm": comm,
        "exposed": exposed,
        "preflight": checked,
        "mfu": flops,
    }


def seconds(goodput: dict[str, Any]) -> dict[str, float]:
    return {part["name"]: part["seconds"] for part in goodput["parts"]}


def test_the_parts_add_up_to_wall_time_times_processes(finished: dict[str, Any]) -> None:
    run, goodput = finished["run"], finished["goodput"]
    wall = (datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["created_at"])).total_seconds()
    assert goodput["processes"] == 2
    assert sum(seconds(goodput).values()) == pytest.approx(wall * 2, rel=0.01)
    assert sum(part["share"] for part in goodput["parts"]) == pytest.approx(1.0, rel=0.001)
    assert 0 < goodput["goodput"] < 1
    assert goodput["goodput"] == pytest.approx(seconds(goodput)["training"] / (wall * 2), rel=0.01)


def test_each_lost_part_of_this_run_is_named(finished: dict[str, Any]) -> None:
    parts = seconds(finished["goodput"])
    # Checkpoints at the end of epoch 1 and at the stop.
    for name in ("training", "startup", "checkpoint", "restarts", "repeated", "stopping", "data"):
        assert parts.get(name, 0) > 0, (name, parts)
    assert "unitemized" not in parts and "pending" not in parts
    phases = finished["goodput"]["startup_phases"]
    assert set(phases) >= {"startup_launch", "startup_group", "startup_build"}
    assert all(value > 0 for value in phases.values())


def test_the_steps_repeated_after_the_restart_are_counted_lost(finished: dict[str, Any]) -> None:
    # The workers resumed from the checkpoint of step 1024 and took again every step up to where the kill found
    # them: at least up to the step the server had seen before the kill.
    repeated = finished["goodput"]["repeated_steps"]
    assert finished["killed_at"] - STEPS_PER_EPOCH <= repeated < STEPS_PER_EPOCH
    parts = seconds(finished["goodput"])
    # Steps are of one size, so their share of the step time is about their share of the steps taken.
    taken = finished["run"]["step"] + repeated
    assert parts["repeated"] / (parts["repeated"] + parts["training"]) == pytest.approx(repeated / taken, rel=0.5)


def test_the_run_page_shows_the_goodput_bar(finished: dict[str, Any]) -> None:
    page, goodput = finished["page"], finished["goodput"]
    assert f"Goodput {100 * goodput['goodput']:.1f}%" in page
    for part in goodput["parts"]:
        assert f'class="gp-{part["name"]}"' in page and f'data-part="{part["name"]}"' in page


def test_each_ranks_exposed_all_reduce_is_reported_and_summed_up_in_a_sentence(finished: dict[str, Any]) -> None:
    assert {point["rank"] for point in finished["exposed"]} == {0, 1}
    assert all(point["value"] >= 0 for point in finished["exposed"])
    comm = finished["comm"]
    assert comm["ranks"] == 2 and comm["buckets"] == 1 and 0 < comm["share"] < 1
    assert comm["comm_ms"] <= comm["allreduce_ms"] and comm["step_ms"] > comm["comm_ms"]
    sentence = f"{comm['share']:.0%} of each step waits on all-reduce ({comm['comm_ms']:.1f} ms exposed"
    assert sentence in finished["page"] and 'id="comm-box"' in finished["page"]


def test_preflight_named_the_rank_that_claims_another_gpu_and_kept_the_bandwidth(finished: dict[str, Any]) -> None:
    checked = finished["preflight"]
    assert checked["mismatches"] == [{"field": "gpu", "rank": 1, "value": "NVIDIA H100 80GB HBM3", "common": "none"}]
    assert not checked["refused"] and len(checked["fingerprints"]) == 2
    assert all(speed > 0 for speed in checked["bus_gbps"]) and checked["bytes"] == 4 * 2**20
    assert '<li data-rank="1">Rank 1 has gpu <code>NVIDIA H100 80GB HBM3</code>' in finished["page"]
    # The check ran in each launch (the first, and the restart), inside start-up: goodput counts it there.
    assert finished["goodput"]["startup_phases"]["startup_preflight"] > 0


def test_the_model_flops_are_reported_and_without_a_gpu_there_is_no_mfu(finished: dict[str, Any]) -> None:
    flops, run = finished["mfu"], finished["run"]
    assert flops["flops_per_sample"] == 6 * (32 * 256 + 256 * 256 + 256 * 10)
    assert flops["achieved_tflops"] == pytest.approx(flops["flops_per_sample"] * run["samples_per_s"] / 1e12)
    assert flops["gpu"] is None and flops["mfu"] is None and flops["processes"] == 2
    assert "no GPU, so no MFU" in finished["page"]


def test_a_scaling_sweep_of_1_and_2_processes_completes_with_speedup_from_the_stored_throughput(
    server: LiveServer, finished: dict[str, Any]
) -> None:
    with server.api() as api:
        origin = create(api, name="sweep origin", workload="mlp", epochs=3, batch_size=512)
        api.post(f"/api/runs/{origin['id']}/stop").raise_for_status()  # never started: the sweep needs only its config
        started = api.post(f"/api/runs/{origin['id']}/sweep")
        assert started.status_code == 202, started.text
        assert [row["processes"] for row in started.json()["rows"]] == [1, 2]  # the server's 2 slots
        ids = [row["run_id"] for row in started.json()["rows"]]
        done = [wait_status(api, run_id, FINAL, timeout=240) for run_id in ids]
        assert [run["status"] for run in done] == ["succeeded", "succeeded"], [r["status_reason"] for r in done]
        assert [(run["epochs"], run["batch_size"], run["sweep_of"]) for run in done] == [(1, 512, origin["id"])] * 2
        rows = api.get(f"/api/runs/{origin['id']}/sweep").json()["rows"]
        page = api.get(f"/runs/{origin['id']}").text
    one, two = done[0]["samples_per_s"], done[1]["samples_per_s"]
    assert [row["samples_per_s"] for row in rows] == [one, two]
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] == pytest.approx(two / one)
    assert rows[1]["efficiency"] == pytest.approx(two / one / 2)
    assert all(row["comm_share"] is not None for row in rows[1:])  # a single process all-reduces nothing to wait for
    assert f"<td>{two / one:.2f}x</td>" in page and '<tr data-processes="2">' in page
