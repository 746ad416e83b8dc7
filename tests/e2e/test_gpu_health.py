"""A GPU fault end to end: a real 2-rank torchrun (gloo, CPU) whose node's sampler reads the fake NVML; an Xid is
injected on GPU 1 while the run trains. The run's "What went wrong" names it, with its meaning and the rank on that
GPU, and the `gpu_fault` alert reaches a real webhook receiver."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from rankboard import gpu

from tests.app.test_alerts import Receiver
from tests.e2e.runs import FINAL, create, wait_status
from tests.live import serving, wait_for

pytestmark = pytest.mark.e2e


def two_gpus(**top: Any) -> dict[str, Any]:
    gpus = [{"uuid": f"GPU-{i}-fake", "name": "NVIDIA H100 80GB HBM3", "util": [40, 90], "power": 400_000,
             "ecc": {"corrected_volatile": 0, "uncorrected_volatile": 0}, "remapped_rows": [0, 0, 0, 0],
             "clocks_event_reasons": 0x4, "pcie_replay": 0, "energy": 1_000_000}
            for i in range(2)]  # fmt: skip
    return {"gpus": gpus, **top}


def test_an_xid_injected_mid_run_is_explained_and_alerts(tmp_path: Path) -> None:
    fake = tmp_path / "nvml.json"
    fake.write_text(json.dumps(two_gpus()))
    receiver = Receiver()
    hooks = json.dumps([{"url": f"{receiver.url}/gpu", "events": ["gpu_fault"]}])
    env = {gpu.ENV_FAKE_NVML: str(fake), "RANKBOARD_ALERT_WEBHOOKS": hooks}
    try:
        server_root = tmp_path / "server"
        with (
            serving(server_root, RANKBOARD_SLOTS="2", RANKBOARD_STOP_GRACE_S="5", **env) as server,
            server.api() as api,
        ):
            run = create(api, workload="mlp", epochs=10_000)
            url = f"/api/runs/{run['id']}"
            nodes = wait_for(lambda: api.get(url).json()["gpus"], 120, what="the node's GPU inventory")
            wait_for(lambda: len(api.get(f"{url}/ranks").json()) == 2, 60, what="both ranks' heartbeats")
            assert api.get(f"{url}/diagnoses").json() == []  # healthy so far
            fake.write_text(json.dumps(two_gpus(xid_events=[{"index": 1, "xid": 79, "at": time.time()}])))
            found = wait_for(lambda: _xids(api, url), 60, what="the Xid in what went wrong")
            wait_for(lambda: receiver.got, 60, what="the gpu_fault alert")
            panel = api.get(f"/runs/{run['id']}/logs").text
            assert api.post(f"{url}/stop").status_code == 202
            wait_status(api, run["id"], FINAL, timeout=60)
    finally:
        receiver.close()
    host = nodes[0]["host"]
    assert [g["index"] for g in nodes[0]["gpus"]] == [0, 1]
    (xid,) = found
    assert xid["line"].startswith(f"GPU 1 on {host} reported Xid 79 (GPU has fallen off the bus) at ")
    assert xid["rank"] == 1  # the rank on GPU 1: local rank 1 of the node
    assert "Xid 79 (GPU has fallen off the bus)" in panel
    path, body = receiver.got[0]
    assert (path, body["condition"]) == ("/gpu", "gpu_fault")
    assert f"GPU 1 on {host} reported Xid 79" in body["message"]


def _xids(api: Any, url: str) -> list[dict[str, Any]]:
    return [d for d in api.get(f"{url}/diagnoses").json() if d["kind"] == "gpu_xid"]
