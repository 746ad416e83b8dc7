"""The GPUs' health as the sampler reads it through the fake NVML: each health call in NVML's units, a call a GPU
does not support never asked again, NVLinks that do not answer dropped, Xid events drained without waiting and
posted one a pass, counters posted only when they move, the energy counter read once a minute."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from rankboard import gpu, wire
from rankboard.gpu_fake import NVML_ERROR_FUNCTION_NOT_FOUND, FakeNvml, Handle, NVMLError

HEALTHY = {
    "uuid": "GPU-0-fake", "name": "NVIDIA H100 80GB HBM3", "power": 500_000,
    "ecc": {"corrected_volatile": 2, "uncorrected_volatile": 0, "corrected_aggregate": 7, "uncorrected_aggregate": 1},
    "remapped_rows": [3, 1, 0, 0], "retired_pages_pending": 0, "clocks_event_reasons": 0x4, "pcie_replay": 5,
    "nvlink_errors": [[1, 2, 3, 4, 5], [10, 20, 30, 40, 50]], "energy": 9_000_000,
    "gpm": {"2": 95.8, "3": 14.2, "5": 93.0, "10": 23.6},  # as an H100 under bf16 matmuls (NVML-H100.md)
}  # fmt: skip
BARE = {"uuid": "GPU-1-fake", "name": "Tesla T4"}  # answers NOT_SUPPORTED to every health call


class ListSink:
    """Keeps what the sampler posts, as a reporter would send it."""

    def __init__(self) -> None:
        self.samples: list[tuple[int, dict[str, float]]] = []
        self.nodes: list[wire.Node] = []

    def sample(self, metrics: Mapping[str, float], *, step: int) -> None:
        self.samples.append((step, dict(metrics)))

    def node(self, node: wire.Node) -> None:
        self.nodes.append(node)


def write(path: Path, gpus: list[dict[str, Any]], **top: Any) -> Path:
    path.write_text(json.dumps({"gpus": gpus, **top}))
    return path


def opened(path: Path) -> FakeNvml:
    nvml = FakeNvml(path)
    nvml.nvmlInit()
    return nvml


def next_second() -> None:
    time.sleep(1.02 - time.time() % 1)  # a pass per whole second: the sampler's step is the unix second


def key(index: int, field: str) -> str:
    return wire.GPU_KEY.format(host="node-a", index=index, field=field)


def test_each_health_call_answers_in_nvmls_units(tmp_path: Path) -> None:
    nvml = opened(write(tmp_path / "nvml.json", [HEALTHY]))
    values, errors = gpu.read_gpu(nvml, Handle(0), gpu.GpuState())
    assert errors == {}
    assert {
        f: values[f] for f in ("ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate")
    } == {"ecc_sbe_volatile": 2, "ecc_dbe_volatile": 0, "ecc_sbe_aggregate": 7, "ecc_dbe_aggregate": 1}
    assert [values[f] for f in gpu.REMAP_FIELDS] == [3, 1, 0, 0]
    assert (values["retired_pending"], values["throttle"], values["pcie_replay"]) == (0, 4, 5)
    assert [values[f] for f in gpu.NVLINK_FIELDS] == [11, 22, 33, 44, 55]  # each counter summed over the links
    assert values["energy"] == 9_000  # J, from NVML's mJ
    assert "xid" not in values  # none happened
    assert set(values) - {"util", "mem_used", "mem_total", "temp", "power", "power_limit", "sm_clock"} <= set(
        wire.GPU_FIELDS
    )


def test_a_call_the_gpu_does_not_support_is_never_asked_again(tmp_path: Path) -> None:
    nvml = opened(write(tmp_path / "nvml.json", [HEALTHY, BARE]))
    state = gpu.GpuState()
    first, errors = gpu.read_gpu(nvml, Handle(1), state)
    assert errors == {}  # NOT_SUPPORTED is no error to warn of
    assert set(first) == {"util", "mem_used", "mem_total", "temp", "power", "power_limit", "sm_clock"}
    asked = dict(nvml.calls)
    assert asked["nvmlDeviceGetTotalEccErrors"] == 4 and asked["nvmlDeviceGetRemappedRows"] == 1
    for _ in range(5):
        assert gpu.read_gpu(nvml, Handle(1), state)[0] == first
    after = {call: n for call, n in nvml.calls.items() if call != "nvmlEventSetWait_v2"}
    assert after == {call: n for call, n in asked.items() if call != "nvmlEventSetWait_v2"}  # not one call more
    assert "ecc_dbe_volatile" in state.unsupported and "/".join(gpu.NVLINK_FIELDS) in state.unsupported


def test_nvlinks_that_do_not_answer_are_dropped_and_the_rest_still_summed(tmp_path: Path) -> None:
    nvml = opened(write(tmp_path / "nvml.json", [HEALTHY]))
    state = gpu.GpuState()
    gpu.read_gpu(nvml, Handle(0), state)
    first = nvml.calls["nvmlDeviceGetNvLinkErrorCounter"]
    assert state.silent_links == set(range(2, nvml.NVML_NVLINK_MAX_LINKS))  # the fake GPU has links 0 and 1
    values, _ = gpu.read_gpu(nvml, Handle(0), state)
    assert nvml.calls["nvmlDeviceGetNvLinkErrorCounter"] - first == 2 * len(gpu.NVLINK_FIELDS)  # two links, 5 each
    assert values["nvlink_replay"] == 11


def test_an_old_driver_without_clock_event_reasons_answers_through_throttle_reasons(tmp_path: Path) -> None:
    class OldDriver(FakeNvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)  # the symbol is missing before driver 535

    nvml = OldDriver(write(tmp_path / "nvml.json", [HEALTHY]))
    nvml.nvmlInit()
    values, errors = gpu.read_gpu(nvml, Handle(0), gpu.GpuState())
    assert values["throttle"] == 4 and errors == {}


def test_xids_are_drained_without_waiting_and_posted_one_a_pass(tmp_path: Path) -> None:
    fake = write(tmp_path / "nvml.json", [HEALTHY, dict(HEALTHY, uuid="GPU-1")])
    sink = ListSink()
    sampler = gpu.GpuSampler(sink, host="node-a", environ={gpu.ENV_FAKE_NVML: str(fake)})
    sampler.open()
    next_second()
    sampler.sample_once()
    now = time.time()
    events = [{"index": 1, "xid": 79, "at": now}, {"index": 1, "xid": 48, "at": now}, {"index": 0, "xid": 13, "at": 0}]
    write(fake, [HEALTHY, dict(HEALTHY, uuid="GPU-1")], xid_events=events)  # injected while it runs
    posted = []
    for _ in range(3):
        next_second()
        started = time.monotonic()
        sampler.sample_once()
        assert time.monotonic() - started < 0.5  # a timeout of 0: the pass never waits for an event
        posted.append({k: v for k, v in sink.samples[-1][1].items() if k.endswith("/xid")})
    sampler.stop()
    assert posted == [{key(0, "xid"): 13, key(1, "xid"): 79}, {key(1, "xid"): 48}, {}]  # in order, one a pass


def test_each_gpu_registers_for_xid_events_once_and_frees_them_when_closed(tmp_path: Path) -> None:
    fake = write(tmp_path / "nvml.json", [HEALTHY, dict(BARE, xid_supported=False)])
    sink = ListSink()
    sampler = gpu.GpuSampler(sink, host="node-a", environ={gpu.ENV_FAKE_NVML: str(fake)})
    sampler.open()
    nvml = sampler._nvml
    assert isinstance(nvml, FakeNvml)
    for _ in range(3):
        next_second()
        sampler.sample_once()
    assert nvml.calls["nvmlDeviceRegisterEvents"] == 2  # once per GPU: GPU 1's NOT_SUPPORTED is not asked again
    assert "xid" in sampler.states[1].unsupported
    events = sampler.states[0].events
    sampler.close()
    assert events.freed and sampler.states[0].events is None


def test_counters_are_posted_when_they_move_and_energy_is_read_once_a_minute(tmp_path: Path) -> None:
    fake = write(tmp_path / "nvml.json", [HEALTHY])
    sink = ListSink()
    sampler = gpu.GpuSampler(sink, host="node-a", environ={gpu.ENV_FAKE_NVML: str(fake)})
    sampler.open()
    nvml = sampler._nvml
    assert isinstance(nvml, FakeNvml)
    next_second()
    sampler.sample_once()
    next_second()
    sampler.sample_once()
    first, second = sink.samples[0][1], sink.samples[1][1]
    assert key(0, "ecc_sbe_volatile") in first and key(0, "energy") in first
    assert key(0, "ecc_sbe_volatile") not in second and key(0, "energy") not in second  # unchanged; energy not due
    assert key(0, "throttle") in second and key(0, "util") in second  # a state, not a count: every pass
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == 8  # read every pass all the same
    assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1

    write(fake, [dict(HEALTHY, ecc=dict(HEALTHY["ecc"], uncorrected_volatile=1))])
    next_second()
    sampler.sample_once()
    moved = sink.samples[-1][1]
    assert moved[key(0, "ecc_dbe_volatile")] == 1 and key(0, "ecc_sbe_volatile") not in moved
    sampler.close()


def test_the_energy_counter_is_read_once_more_as_sampling_stops(tmp_path: Path) -> None:
    fake = write(tmp_path / "nvml.json", [dict(HEALTHY, energy_at=time.time())])  # grows at the GPU's 500 W
    sink = ListSink()
    sampler = gpu.GpuSampler(sink, host="node-a", environ={gpu.ENV_FAKE_NVML: str(fake)})
    sampler.open()
    next_second()
    sampler.sample_once()
    next_second()
    sampler.stop()
    energies = [metrics[key(0, "energy")] for _, metrics in sink.samples if key(0, "energy") in metrics]
    assert len(energies) == 2 and energies[1] - energies[0] == pytest.approx(500, rel=0.2)  # ~1 s at 500 W, in J


def test_gpm_metrics_come_from_two_samples_a_pass_apart_and_every_sample_is_freed(tmp_path: Path) -> None:
    nvml = opened(write(tmp_path / "nvml.json", [HEALTHY, BARE]))
    hopper, older = gpu.GpuState(), gpu.GpuState()
    first, _ = gpu.read_gpu(nvml, Handle(0), hopper)
    assert "sm_active" not in first  # one sample so far: no interval to measure over
    second, errors = gpu.read_gpu(nvml, Handle(0), hopper)
    assert errors == {}
    assert {f: second[f] for f in gpu.GPM_METRICS} == {
        "sm_active": 95.8, "sm_occupancy": 14.2, "tensor_active": 93.0, "dram_bw": 23.6
    }  # fmt: skip
    assert nvml.gpm_samples == 1  # the older sample freed once used; the newer kept for the next pass
    for _ in range(3):
        gpu.read_gpu(nvml, Handle(1), older)
    assert "/".join(gpu.GPM_METRICS) in older.unsupported
    assert nvml.calls["nvmlGpmQueryDeviceSupport"] == 2  # once per GPU, however many passes
    gpu.free_state(nvml, hopper)
    assert nvml.gpm_samples == 0
