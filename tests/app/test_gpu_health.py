"""A run's GPU faults as a user meets them: posted through the real ingest endpoint as the sampler sends them
(step = unix second), then read back as "What went wrong", in the health of a run that stopped, as a straggler's
likely cause, as the `gpu_fault` alert, and on /metrics."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rankboard import gpu, wire
from sqlalchemy import select, update

from app.core.models import Alert, Run, RunRank, utcnow
from app.core.settings import Settings, Webhook
from app.services import alerts
from tests.app.conftest import post, running_run
from tests.live import LiveServer

HOST = "node-7"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The suite's settings with /metrics served."""
    return settings.model_copy(update={"prometheus": True})


def gpu_points(client: TestClient, run_id: int, index: int, field: str, values: dict[int, float]) -> None:
    """One GPU's samples of a field, {unix second: value}."""
    key = wire.GPU_KEY.format(host=HOST, index=index, field=field)
    points = tuple(wire.Point(key, step, value, 0, float(step)) for step, value in values.items())
    assert post(client, run_id, wire.Batch(points).to_json()).status_code == 200


def two_ranks_on_two_gpus(client: TestClient, run_id: int, *, started: datetime) -> None:
    """Ranks 0 and 1 on HOST, on its GPUs 0 and 1 (the node's inventory), the run started at `started`."""
    gpus = tuple(wire.Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3") for i in (0, 1))
    beats = tuple(wire.Heartbeat(rank=r, host=HOST, step=10) for r in (0, 1))
    body = wire.Batch(node=wire.Node(HOST, gpus, None), heartbeats=beats).to_json()
    assert post(client, run_id, body).status_code == 200
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.execute(update(Run).where(Run.id == run_id).values(started_at=started))


def clock(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).strftime("%H:%M:%S")


def test_an_xid_is_what_went_wrong_named_with_its_gpu_its_rank_and_its_meaning(client: TestClient) -> None:
    run_id = running_run(client)
    now = int(time.time())
    two_ranks_on_two_gpus(client, run_id, started=utcnow() - timedelta(minutes=5))
    gpu_points(client, run_id, 1, "xid", {now - 30: 79})
    gpu_points(client, run_id, 0, "xid", {now - 3600: 13})  # before this launch: not this run's trouble

    found = client.get(f"/api/runs/{run_id}/diagnoses").json()
    assert [d["kind"] for d in found] == ["gpu_xid"]
    xid = found[0]
    assert xid["line"] == f"GPU 1 on {HOST} reported Xid 79 (GPU has fallen off the bus) at {clock(now - 30)}"
    assert (xid["rank"], xid["log_rank"], xid["stream"]) == (1, 1, "stderr")  # the panel opens on rank 1's stderr
    assert "drain the node" in xid["advice"]
    panel = client.get(f"/runs/{run_id}/logs").text
    assert "What went wrong" in panel and "Xid 79 (GPU has fallen off the bus)" in panel


def test_a_double_bit_ecc_error_and_a_pending_remap_during_the_run_are_explained(client: TestClient) -> None:
    run_id = running_run(client)
    now = int(time.time())
    two_ranks_on_two_gpus(client, run_id, started=utcnow() - timedelta(minutes=5))
    gpu_points(client, run_id, 0, "ecc_dbe_volatile", {now - 60: 0, now - 20: 2})
    gpu_points(client, run_id, 1, "ecc_dbe_volatile", {now - 60: 4, now - 20: 4})  # counted before: no fault
    gpu_points(client, run_id, 0, "remap_pending", {now - 60: 0, now - 10: 1})

    found = {d["kind"]: d for d in client.get(f"/api/runs/{run_id}/diagnoses").json()}
    assert set(found) == {"gpu_ecc", "gpu_remap"}
    assert (
        found["gpu_ecc"]["line"]
        == f"GPU 0 on {HOST} counted 2 double-bit (uncorrectable) ECC errors at {clock(now - 20)}"
    )
    assert found["gpu_remap"]["line"].startswith(f"GPU 0 on {HOST} has a memory row remap pending")


def test_a_stalled_runs_health_names_the_xid_seconds_before_its_rank_went_silent(client: TestClient) -> None:
    run_id = running_run(client)
    now = int(time.time())
    two_ranks_on_two_gpus(client, run_id, started=utcnow() - timedelta(minutes=5))
    last_heard = datetime.fromtimestamp(now - 200, UTC)
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.execute(update(RunRank).where(RunRank.run_id == run_id).values(heartbeat_at=last_heard))
    gpu_points(client, run_id, 1, "xid", {now - 203: 79})

    health = client.get(f"/api/runs/{run_id}/health").json()
    assert health["state"] == "not_progressing"
    expected = f"GPU 1 on {HOST} reported Xid 79 (GPU has fallen off the bus) at {clock(now - 203)}, 3 s before rank 1"
    assert f"{expected} stopped reporting" in health["message"]


def test_a_straggler_on_a_gpu_its_hardware_slowed_is_named_with_that_cause(client: TestClient) -> None:
    run_id = running_run(client)
    now = int(time.time())
    two_ranks_on_two_gpus(client, run_id, started=utcnow() - timedelta(minutes=5))
    step_ms, data_ms, compute_ms = wire.RANK_TIME_KEYS[:3]
    points = tuple(
        wire.Point(key, step, value, rank, float(now - 40 + step))
        for step in range(10, 16)
        for rank in (0, 1)
        for key, value in ((step_ms, 100.0), (data_ms, 60.0 if rank == 1 else 5.0), (compute_ms, 40.0))
    )
    assert post(client, run_id, wire.Batch(points).to_json()).status_code == 200
    gpu_points(client, run_id, 0, "throttle", {now - s: 0x4 for s in range(30)})  # both at their power cap ...
    gpu_points(client, run_id, 1, "throttle", {now - s: 0x4 | 0x40 for s in range(30)})  # ... rank 1's GPU also hot

    slow = client.get(f"/api/runs/{run_id}/health").json()["stragglers"]
    assert [s["rank"] for s in slow] == [1]
    assert slow[0]["sentence"].endswith(
        f"; its GPU 1 on {HOST} was throttled (thermal): the likely cause"
    )  # the power cap every GPU shares sets none apart
    diagnoses = client.get(f"/api/runs/{run_id}/diagnoses").json()
    assert [d["kind"] for d in diagnoses] == ["gpu_hw_slowdown"]
    assert "slowed by its hardware (hardware thermal slowdown) in 30 samples" in diagnoses[0]["line"]


def test_a_gpu_fault_raises_the_gpu_fault_alert_once_and_shows_on_metrics(client: TestClient, tmp_path: Path) -> None:
    run_id = running_run(client)
    now = int(time.time())
    two_ranks_on_two_gpus(client, run_id, started=utcnow() - timedelta(minutes=5))
    rules = alerts.AlertRules((Webhook(url="http://127.0.0.1:9/hook", events=["gpu_fault"]),), 0, tmp_path, "")  # type: ignore[arg-type]

    def check() -> list[Alert]:
        with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
            alerts.check(db, runs=[db.get(Run, run_id)], rules=rules, now=utcnow())
        with client.app.state.sessions() as db:  # type: ignore[attr-defined]
            return list(db.scalars(select(Alert).where(Alert.run_id == run_id)))

    assert check() == []
    gpu_points(client, run_id, 1, "xid", {now - 5: 79})
    gpu_points(client, run_id, 1, "ecc_dbe_volatile", {now - 5: 1})
    raised = check()
    assert [(a.condition, a.cleared_at) for a in raised] == [("gpu_fault", None)]
    assert f"GPU 1 on {HOST} reported Xid 79 (GPU has fallen off the bus)" in raised[0].message
    assert len(check()) == 1  # one alert while the fault holds, not one a tick
    deliveries = client.get(f"/api/runs/{run_id}/alerts").json()
    assert [d["condition"] for d in deliveries] == ["gpu_fault"]

    exposition = client.get("/metrics").text
    labels = f'gpu="1",host="{HOST}",run_id="{run_id}"'
    assert f"rankboard_gpu_last_xid{{{labels}}} 79.0" in exposition
    assert f"rankboard_gpu_ecc_uncorrected_errors{{{labels}}} 1.0" in exposition


def test_the_host_page_shows_each_gpus_health_and_what_it_does_not_support(tmp_path: Path) -> None:
    healthy = {"uuid": "GPU-0-fake", "name": "NVIDIA H100 80GB HBM3", "clocks_event_reasons": 0x4 | 0x40,
               "ecc": {"corrected_volatile": 3, "uncorrected_volatile": 1}, "remapped_rows": [2, 1, 1, 0],
               "pcie_replay": 0}  # fmt: skip
    bare = {"uuid": "GPU-1-fake", "name": "Tesla T4", "xid_supported": False}
    fake = tmp_path / "nvml.json"
    fake.write_text(json.dumps({"gpus": [healthy, bare], "xid_events": [{"index": 0, "xid": 48, "at": 0}]}))
    server = LiveServer(tmp_path / "server", RANKBOARD_SUPERVISE_INTERVAL_S="3600", **{gpu.ENV_FAKE_NVML: str(fake)})
    server.start()
    try:
        with server.api() as api:
            first, second = api.get("/api/host").json()["gpus"]
            page = api.get("/host").text
    finally:
        server.stop()
    assert (first["ecc_sbe_volatile"], first["ecc_dbe_volatile"], first["remap_pending"]) == (3, 1, 1)
    assert first["health"]["throttle_reasons"] == ["hardware thermal slowdown", "software power cap"]
    assert (first["health"]["xid"], first["health"]["xid_meaning"]) == (48, "double-bit ECC error")
    lacking = {"page retirement", "NVLink error counters", "energy counter", "GPM metrics"}
    assert set(first["health"]["not_supported"]) == lacking
    assert second["ecc_dbe_volatile"] is None and "ECC" in second["health"]["not_supported"]
    assert "Xid events" in second["health"]["not_supported"]
    assert "1 uncorrected" in page and "pending (needs a reset)" in page and "48 (double-bit ECC error)" in page
    assert "held down by hardware thermal slowdown, software power cap" in page
    assert page.count("not supported") >= 4  # GPU 1's ECC, row remap, clocks and Xid
