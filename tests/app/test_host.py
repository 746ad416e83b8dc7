"""The Host page and /api/host on a real server, with the fake NVML (CI has no GPU): each GPU, live, and the run
holding it; without NVML, the reason and the CPU instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rankboard import gpu

from tests.live import LiveServer, open_run, set_run, wait_for

TOKEN = "host-token"
GIB = 2**30


def serve(root: Path, spec: dict[str, Any]) -> LiveServer:
    fake = root / "nvml.json"
    root.mkdir(parents=True, exist_ok=True)
    fake.write_text(json.dumps(spec))
    server = LiveServer(root, RANKBOARD_SUPERVISE_INTERVAL_S="3600", **{gpu.ENV_FAKE_NVML: str(fake)})
    server.start()
    return server


@pytest.fixture
def gpu_server(tmp_path: Path) -> Iterator[LiveServer]:
    """Two GPUs: GPU 0 runs this test's process (2 GiB) and pid 1 (someone else's, 1 GiB); GPU 1 runs nothing."""
    gpus = [
        {"uuid": f"GPU-{i}bbb-fake", "name": "NVIDIA H100 80GB HBM3", "util": [5, 50, 90], "memory_used": 3 * GIB,
         "memory_total": 80 * GIB, "temp": 50, "power": 300_000, "power_limit": 700_000, "sm_clock": 1755}
        for i in range(2)
    ]  # fmt: skip
    gpus[0]["processes"] = [{"pid": os.getpid(), "used_memory": 2 * GIB}, {"pid": 1, "used_memory": GIB}]
    server = serve(tmp_path, {"gpus": gpus})
    yield server
    server.stop()


@pytest.fixture
def cpu_server(tmp_path: Path) -> Iterator[LiveServer]:
    server = serve(tmp_path, {"library": "missing"})
    yield server
    server.stop()


def host_json(server: LiveServer) -> dict[str, Any]:
    with server.api() as api:
        return api.get("/api/host").json()  # type: ignore[no-any-return]


def test_each_gpu_is_shown_with_the_run_that_holds_it(gpu_server: LiveServer) -> None:
    by_devices = open_run(gpu_server, TOKEN)
    set_run(gpu_server, by_devices, pid=None, devices=[1], name="given GPU 1")
    by_process = open_run(gpu_server, TOKEN)  # its pid is this test's, which NVML lists on GPU 0
    set_run(gpu_server, by_process, devices=[], name="runs on GPU 0")
    finished = open_run(gpu_server, TOKEN, status="succeeded")
    set_run(gpu_server, finished, pid=None, devices=[0, 1])  # a finished run holds nothing

    host = host_json(gpu_server)
    assert host["nvml_error"] is None
    gpu0, gpu1 = host["gpus"]
    assert (gpu0["index"], gpu0["uuid"], gpu0["mem_total"], gpu0["power"]) == (0, "GPU-0bbb-fake", 80 * GIB, 300.0)
    assert [(h["run_id"], h["by_devices"], h["memory"]) for h in gpu0["held_by"]] == [(by_process, False, 2 * GIB)]
    assert [(p["pid"], p["run_id"]) for p in gpu0["processes"]] == [(os.getpid(), by_process), (1, None)]
    assert [(h["run_id"], h["by_devices"]) for h in gpu1["held_by"]] == [(by_devices, True)]

    with gpu_server.api() as api:
        page = api.get("/host").text
        fragment = api.get("/host", headers={"HX-Request": "true", "HX-Target": "host-now"}).text
    assert "NVIDIA H100 80GB HBM3" in page and "GPU-1bbb-fake" in page and 'href="/host"' in page
    assert f'href="/runs/{by_devices}"' in page and "given GPU 1" in page and "runs on GPU 0" in page
    assert f'href="/runs/{finished}"' not in page
    assert 'hx-trigger="every 2s"' in page  # the live part polls itself
    assert "<html" not in fragment and "given GPU 1" in fragment and "1 other process" in fragment


def test_utilization_is_read_live(gpu_server: LiveServer) -> None:
    first = host_json(gpu_server)["gpus"][0]["util"]
    wait_for(lambda: host_json(gpu_server)["gpus"][0]["util"] != first, 10, what="utilization to change")


def test_without_nvml_the_page_says_why_and_shows_cpu_and_memory(cpu_server: LiveServer) -> None:
    host = host_json(cpu_server)
    assert host["gpus"] == []
    assert host["nvml_error"] == "NVML did not start: NVML Shared Library Not Found"
    assert host["cpu_percent"] is None and 0 < host["mem_used"] < host["mem_total"]  # the CPU's first interval
    host = wait_for(lambda: (h := host_json(cpu_server))["cpu_percent"] is not None and h, 5, what="a CPU reading")
    assert 0 <= host["cpu_percent"] <= 100
    with cpu_server.api() as api:
        page = api.get("/host").text
    assert "No NVIDIA GPU found" in page and "NVML Shared Library Not Found" in page
    assert "% busy" in page and "used of" in page


def test_the_cpu_is_shown_only_once_measured_and_then_busy_while_every_core_is(cpu_server: LiveServer) -> None:
    spin = "print('spinning', flush=True)\nwhile True: pass"
    cores = os.cpu_count() or 1
    spinners = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE) for _ in range(cores)]
    try:
        for spinner in spinners:
            assert spinner.stdout is not None and spinner.stdout.readline() == b"spinning\n"  # started, now spinning
        with cpu_server.api() as api:
            first = api.get("/host").text  # the page's first paint: psutil's first reading measures nothing
            assert "measuring…" in first and "% busy" not in first
            busy = wait_for(lambda: "% busy" in (page := api.get("/host").text) and page, 5, what="a CPU reading")
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    percent = int(busy.split("% busy")[0].rsplit(">", 1)[-1])
    assert percent >= 50, busy  # every core spins: the reading says so (before, the first paint said "0% busy")
