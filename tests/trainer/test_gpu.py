"""GPU sampling through the fake NVML (the only stand-in: CI has no GPU), posted by the real client to the real
server: every GPU of every node arrives, a node without NVML says why and samples its CPU, a broken GPU stops
only itself, and every rank's heartbeat lands."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rankboard import gpu, wire
from rankboard.gpu_fake import FakeNvml
from rankboard.report import Reporter
from sqlalchemy import select

from app.core.db import make_engine
from app.core.models import RunRank
from tests.live import LiveServer, open_run, points, wait_for

TOKEN = "gpu-token"
GIB = 2**30
UTIL_PATTERN = [10, 60, 95]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path / "server", RANKBOARD_SUPERVISE_INTERVAL_S="3600")  # runs are opened, not launched
    server.start()
    yield server
    server.stop()


def two_gpus(**overrides: Any) -> dict[str, Any]:
    """Two H100s; GPU 1 runs this process (3 GiB, so the run's own) and pid 1 (5 GiB, someone else's)."""
    gpus = [
        {"uuid": f"GPU-{i}aaa-fake", "name": "NVIDIA H100 80GB HBM3", "util": UTIL_PATTERN,
         "memory_used": (i + 1) * 10 * GIB, "memory_total": 80 * GIB, "temp": 40 + i, "power": 250_000,
         "power_limit": 700_000, "sm_clock": 1980, "processes": []}
        for i in range(2)
    ]  # fmt: skip
    gpus[1]["processes"] = [{"pid": os.getpid(), "used_memory": 3 * GIB}, {"pid": 1, "used_memory": 5 * GIB}]
    return {"gpus": gpus, **overrides}


def write_fake(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(json.dumps(spec))
    return path


def reporter(server: LiveServer, run_id: int, spool: Path, rank: int, **options: float) -> Reporter:
    return Reporter(server.url, str(run_id), TOKEN, spool, rank=rank, flush_interval=0.05, **options)  # type: ignore[arg-type]


def series(server: LiveServer, run_id: int, key: str) -> list[dict[str, Any]]:
    with server.api() as api:
        return points(api, run_id, key, limit=10_000)


def run_json(server: LiveServer, run_id: int) -> dict[str, Any]:
    with server.api() as api:
        return api.get(f"/api/runs/{run_id}").json()  # type: ignore[no-any-return]


# What every GPU reports every second; its health fields only where its description has them (test_gpu_health.py).
LOAD_FIELDS = ("util", "mem_used", "mem_total", "temp", "power", "power_limit", "sm_clock", "run_mem")


def gpu_key(host: str, index: int, field: str) -> str:
    return wire.GPU_KEY.format(host=host, index=index, field=field)


def test_every_gpu_of_every_node_arrives_with_the_nodes_inventory(server: LiveServer, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN)
    environ = {gpu.ENV_FAKE_NVML: str(write_fake(tmp_path / "nvml.json", two_gpus()))}
    nodes = {"node-a": 0, "node-b": 2}  # host: the global rank of its local rank 0
    reporters = {host: reporter(server, run_id, tmp_path / host, rank) for host, rank in nodes.items()}
    started = int(time.time())
    samplers = [gpu.GpuSampler(reporters[host], host=host, environ=environ).start() for host in nodes]
    keys = [gpu_key(host, index, field) for host in nodes for index in (0, 1) for field in LOAD_FIELDS]
    wait_for(lambda: all(len(series(server, run_id, key)) >= 2 for key in keys), 20, what="two samples of each")
    for sampler in samplers:
        sampler.stop()
    for client in reporters.values():
        client.close()
    ended = int(time.time())

    for host, rank in nodes.items():
        util = series(server, run_id, gpu_key(host, 0, "util"))
        assert {p["rank"] for p in util} == {rank}
        assert all(started <= p["step"] <= ended for p in util)  # step = the unix second of the sample
        assert {p["value"] for p in util} <= set(map(float, UTIL_PATTERN))
        assert series(server, run_id, gpu_key(host, 1, "mem_used"))[0]["value"] == 20 * GIB
        assert series(server, run_id, gpu_key(host, 1, "power"))[0]["value"] == 250.0  # watts, from NVML's mW
        assert series(server, run_id, gpu_key(host, 1, "temp"))[0]["value"] == 41
        assert series(server, run_id, gpu_key(host, 1, "run_mem"))[0]["value"] == 3 * GIB  # not pid 1's 5 GiB
        assert series(server, run_id, gpu_key(host, 0, "run_mem"))[0]["value"] == 0
    inventory = [{"index": i, "uuid": f"GPU-{i}aaa-fake", "name": "NVIDIA H100 80GB HBM3"} for i in (0, 1)]
    assert run_json(server, run_id)["gpus"] == [
        {"host": host, "gpus": inventory, "nvml_error": None} for host in ("node-a", "node-b")
    ]


def test_without_nvml_the_node_says_why_and_samples_cpu_and_memory(server: LiveServer, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN)
    environ = {gpu.ENV_FAKE_NVML: str(write_fake(tmp_path / "nvml.json", {"library": "missing"}))}
    client = reporter(server, run_id, tmp_path, 0)
    sampler = gpu.GpuSampler(client, host="cpu-node", environ=environ).start()
    keys = [wire.SYS_KEY.format(host="cpu-node", field=field) for field in wire.SYS_FIELDS]
    wait_for(lambda: all(series(server, run_id, key) for key in keys), 20, what="CPU and memory samples")
    sampler.stop()
    client.close()

    assert run_json(server, run_id)["gpus"] == [
        {"host": "cpu-node", "gpus": [], "nvml_error": "NVML did not start: NVML Shared Library Not Found"}
    ]
    percent = series(server, run_id, "sys/cpu-node/cpu_percent")[0]["value"]
    used, total = (series(server, run_id, f"sys/cpu-node/{field}")[0]["value"] for field in ("mem_used", "mem_total"))
    assert 0 <= percent <= 100 and 0 < used < total
    with server.api() as api:
        assert not [key for key in api.get(f"/api/runs/{run_id}/metrics").json() if key.startswith("gpu/")]


def test_the_first_cpu_sample_is_measured_over_an_interval(server: LiveServer, tmp_path: Path) -> None:
    spin = "print('spinning', flush=True)\nwhile True: pass"
    spinners = [
        subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE) for _ in range(os.cpu_count() or 1)
    ]
    try:
        for spinner in spinners:
            assert spinner.stdout is not None and spinner.stdout.readline() == b"spinning\n"
        run_id = open_run(server, TOKEN)
        environ = {gpu.ENV_FAKE_NVML: str(write_fake(tmp_path / "nvml.json", {"library": "missing"}))}
        client = reporter(server, run_id, tmp_path, 0)
        sampler = gpu.GpuSampler(client, host="cpu-node", environ=environ).start()
        first = wait_for(lambda: series(server, run_id, "sys/cpu-node/cpu_percent"), 20, what="a CPU sample")[0]
        sampler.stop()
        client.close()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert first["value"] >= 50  # every core spins; a first sample taken right after priming psutil said 0


def test_a_gpu_that_fails_to_read_stops_only_itself(
    server: LiveServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run_id = open_run(server, TOKEN)
    fake = write_fake(tmp_path / "nvml.json", two_gpus())
    client = reporter(server, run_id, tmp_path, 0)
    sampler = gpu.GpuSampler(client, host="node-a", environ={gpu.ENV_FAKE_NVML: str(fake)}).start()
    util0, util1 = gpu_key("node-a", 0, "util"), gpu_key("node-a", 1, "util")
    wait_for(lambda: series(server, run_id, util0) and series(server, run_id, util1), 20, what="first samples")

    broken = two_gpus()
    broken["gpus"][0]["broken"] = True  # every read of GPU 0 now raises NVMLError_GPUIsLost
    write_fake(fake, broken)
    time.sleep(1.5)  # a sample already under way may still have read GPU 0
    before = len(series(server, run_id, util0))
    seen = len(series(server, run_id, util1))
    wait_for(lambda: len(series(server, run_id, util1)) >= seen + 3, 20, what="GPU 1 to go on")
    sampler.stop()
    client.close()

    assert len(series(server, run_id, util0)) == before
    warnings = [line for line in capfd.readouterr().err.splitlines() if "of GPU 0 on node-a" in line]
    assert len(warnings) == 1  # once, not once a second nor once per field
    assert "cannot read util, mem_used/mem_total, temp" in warnings[0] and warnings[0].endswith("GPU is lost")


def test_each_ranks_heartbeat_lands_and_goes_stale_when_its_step_stops(server: LiveServer, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN)
    ranks = [reporter(server, run_id, tmp_path, rank, heartbeat_interval=0.1) for rank in (0, 1)]
    for step in range(1, 50):
        ranks[0].heartbeat(step)  # every step, as the training loop calls it: only the latest is sent
    ranks[1].heartbeat(7)  # rank 1 is behind

    wait_for(lambda: {(r.rank, r.step) for r in rank_rows(server, run_id)} == {(0, 49), (1, 7)}, 10, what="both")
    hung = {r.rank: r.heartbeat_at for r in rank_rows(server, run_id)}[1]
    time.sleep(0.6)  # several heartbeat intervals, with rank 1 still at step 7
    assert {r.rank: r.heartbeat_at for r in rank_rows(server, run_id)}[1] == hung
    ranks[1].heartbeat(8)
    wait_for(lambda: {r.rank: r.step for r in rank_rows(server, run_id)}[1] == 8, 10, what="rank 1 to move on")
    for client in ranks:
        client.close()
    assert {r.host for r in rank_rows(server, run_id)} == {socket.gethostname()[: wire.MAX_HOST_LENGTH]}


def rank_rows(server: LiveServer, run_id: int) -> list[Any]:
    """The run's run_ranks rows, read from the server's database (no API shows them yet)."""
    engine = make_engine(f"sqlite:///{server.root / 'data' / 'rankboard.db'}")
    with engine.connect() as connection:
        rows = connection.execute(select(RunRank.__table__).where(RunRank.run_id == run_id)).all()
    engine.dispose()
    return list(rows)


def test_cuda_visible_devices_picks_gpus_by_index_or_uuid_and_ends_where_cuda_would(tmp_path: Path) -> None:
    nvml = FakeNvml(write_fake(tmp_path / "nvml.json", two_gpus()))
    nvml.nvmlInit()
    assert gpu.visible_indices(nvml, None) == [0, 1]
    assert gpu.visible_indices(nvml, "1,0") == [1, 0]
    assert gpu.visible_indices(nvml, "GPU-1aaa") == [1]  # a UUID prefix, as CUDA takes it
    assert gpu.visible_indices(nvml, "0,7,1") == [0]  # CUDA ignores everything after an index that does not exist
    assert gpu.visible_indices(nvml, "") == []
    with pytest.raises(nvml.NVMLError):
        nvml.nvmlDeviceGetHandleByIndex(2)


def test_sampling_starts_only_on_local_rank_0_inside_a_run_and_at_most_once_a_second(tmp_path: Path) -> None:
    reporter = Reporter("http://127.0.0.1:1", "1", TOKEN, tmp_path, start=False)
    assert gpu.start_sampling(reporter, environ={"LOCAL_RANK": "1"}) is None
    assert gpu.start_sampling(None, environ={"LOCAL_RANK": "0"}) is None  # no reporter: not in a dashboard run
    assert gpu.sample_interval({gpu.ENV_SAMPLE_S: "0.2"}) == gpu.MIN_SAMPLE_S
    assert gpu.sample_interval({gpu.ENV_SAMPLE_S: "5"}) == 5.0
    assert gpu.sample_interval({gpu.ENV_SAMPLE_S: "often"}) == gpu.DEFAULT_SAMPLE_S
    with pytest.raises(ValueError, match="at least"):
        gpu.GpuSampler(Reporter("http://127.0.0.1:1", "1", TOKEN, tmp_path, start=False), interval=0.5)
