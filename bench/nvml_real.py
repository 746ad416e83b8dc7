"""The real NVML path, on a machine with NVIDIA GPUs: every pynvml call `rankboard.gpu` makes, one sampling pass as
the trainer's sampler makes it, and what each costs.

    .venv/bin/python bench/nvml_real.py [--repeats 200]
    .venv/bin/python bench/nvml_real.py --fake [--gpus 8] [--repeats 2000]

Ignores RANKBOARD_FAKE_NVML: this is the check that the fake's answers have the shapes the real library gives.
Prints each GPU's identity and values, which health readings it supports, then the median microseconds of each
call, of one whole pass over all GPUs (what the sampler does once a second) before the health readings (load only)
and after (steady state: the energy counter is read once a minute, so apart), and of the Host page's read. Without
NVML it says why and exits 0. --fake measures the same passes against the fake NVML (any machine): what the
sampler's own code costs, NVML's time aside.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rankboard import gpu, wire

from app.services.host import HostSampler


def median_us(work: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        work()
        times.append(time.perf_counter_ns() - started)
    return statistics.median(times) / 1000


class Collected:
    """A sink that keeps what the sampler gives it, so the pass can be printed."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.inventory: wire.Node | None = None

    def sample(self, metrics: Mapping[str, float], *, step: int) -> None:
        self.metrics.update(metrics)

    def node(self, node: wire.Node) -> None:
        self.inventory = node


def calls(nvml: gpu.Nvml, handle: Any) -> dict[str, Callable[[], object]]:
    """Each pynvml call of the `gpu.Nvml` interface on one GPU."""
    return {
        "nvmlDeviceGetUUID": lambda: nvml.nvmlDeviceGetUUID(handle),
        "nvmlDeviceGetName": lambda: nvml.nvmlDeviceGetName(handle),
        "nvmlDeviceGetUtilizationRates": lambda: nvml.nvmlDeviceGetUtilizationRates(handle),
        "nvmlDeviceGetMemoryInfo": lambda: nvml.nvmlDeviceGetMemoryInfo(handle),
        "nvmlDeviceGetTemperature": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetPowerUsage": lambda: nvml.nvmlDeviceGetPowerUsage(handle),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle),
        "nvmlDeviceGetClockInfo(SM)": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
        "nvmlDeviceGetComputeRunningProcesses": lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle),
        "nvmlDeviceGetTotalEccErrors(DBE, volatile)": lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ),
        "nvmlDeviceGetRemappedRows": lambda: nvml.nvmlDeviceGetRemappedRows(handle),
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "nvmlDeviceGetPcieReplayCounter": lambda: nvml.nvmlDeviceGetPcieReplayCounter(handle),
        "nvmlDeviceGetNvLinkErrorCounter(link 0)": lambda: nvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, 0),
        "nvmlDeviceGetTotalEnergyConsumption": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle),
    }


LOAD = [reading for reading in gpu.READINGS if reading.fields[0] in ("util", "mem_used", "temp", "power",
                                                                        "power_limit", "sm_clock")]  # fmt: skip
STEADY = [reading for reading in gpu.READINGS if reading.every_s <= 1]  # all but the once-a-minute energy read


def check_calls(nvml: gpu.Nvml, index: int, handle: Any, repeats: int) -> None:
    print(f"GPU {index}: {gpu.describe(nvml, index, handle)}")
    for name, call in calls(nvml, handle).items():
        try:
            answer = call()
        except nvml.NVMLError as error:  # e.g. power on a GPU that does not report it: the sampler skips it
            print(f"  {name:40s} raises {type(error).__name__}: {error}")
            continue
        print(f"  {name:40s} {median_us(call, repeats):8.1f} us  -> {answer!r}"[:200])
    state = gpu.GpuState()
    values, errors = gpu.read_gpu(nvml, handle, state)
    print(f"  read_gpu: {values}" + (f"  failed: {errors}" if errors else ""))
    supported = [r.name for r in gpu.READINGS if r.name not in state.unsupported and r.name not in errors]
    print(f"  supported: {', '.join(supported)}")
    print(f"  NOT supported: {', '.join(sorted(state.unsupported)) or 'none'}")
    gpu.free_state(nvml, state)
    try:
        print(f"  processes (pid, bytes): {gpu.gpu_processes(nvml, handle)}")
    except nvml.NVMLError as error:
        print(f"  processes: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--fake", action="store_true", help="measure the passes against the fake NVML instead")
    parser.add_argument("--gpus", type=int, default=8, help="with --fake: how many GPUs")
    args = parser.parse_args()
    if args.fake:
        fake_passes(args.gpus, args.repeats)
        return 0
    real = {key: value for key, value in os.environ.items() if key != gpu.ENV_FAKE_NVML}
    try:
        nvml = gpu.open_nvml(real)
    except gpu.NvmlUnavailable as error:
        print(f"NVML is unavailable on this machine: {error}. Nothing to measure.")
        return 0
    try:
        print(f"NVML module: {getattr(nvml, '__file__', nvml)}; {nvml.nvmlDeviceGetCount()} GPU(s)")
        handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in gpu.visible_indices(nvml, None)]
        for index, handle in handles:
            check_calls(nvml, index, handle, args.repeats)

        passes(nvml, [handle for _index, handle in handles], args.repeats)
    finally:
        nvml.nvmlShutdown()
    sampled_pass(real)
    host = HostSampler(real)
    print(f"Host page read (all GPUs, processes, CPU): median {median_us(host.read, args.repeats):.1f} us")
    host.close()
    return 0


def passes(nvml: gpu.Nvml, handles: list[Any], repeats: int) -> None:
    """The median of one pass over every GPU: load readings only (as before the health readings), steady state
    with them, and with the energy counter too (its once-a-minute pass)."""
    states = [gpu.GpuState() for _ in handles]
    for name, readings in (("load only (before)", LOAD), ("with health (after)", STEADY),
                           ("with health + energy", list(gpu.READINGS))):  # fmt: skip

        def one_pass(readings: list[gpu.Reading] = readings) -> None:
            for handle, state in zip(handles, states, strict=True):
                gpu.read_gpu(nvml, handle, state, readings)
                with contextlib.suppress(nvml.NVMLError):  # as the sampler: a failed read skips, and goes on
                    gpu.gpu_processes(nvml, handle)

        one_pass()  # learns what is not supported, registers for Xid events
        print(f"one sampling pass over {len(handles)} GPU(s), {name}: median {median_us(one_pass, repeats):.1f} us")
    for state in states:
        gpu.free_state(nvml, state)


def fake_passes(count: int, repeats: int) -> None:
    """The passes against the fake NVML: `count` H100s that have every health reading and GPM, two NVLinks each."""
    spec = {"gpus": [{"uuid": f"GPU-{i}", "ecc": {}, "remapped_rows": [0, 0, 0, 0], "retired_pages_pending": 0,
                      "clocks_event_reasons": 4, "pcie_replay": 0, "nvlink_errors": [[0] * 5] * 2, "energy": 1,
                      "gpm": {"2": 95.8, "3": 14.2, "5": 93.0, "10": 23.6}}
                     for i in range(count)]}  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "nvml.json"
        path.write_text(json.dumps(spec))
        nvml = gpu.open_nvml({gpu.ENV_FAKE_NVML: str(path)})
        passes(nvml, [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)], repeats)


def sampled_pass(environ: Mapping[str, str]) -> None:
    """One pass of the trainer's sampler itself, as it would log it."""
    sink = Collected()
    sampler = gpu.GpuSampler(sink, environ=environ)
    sampler.open()
    started = time.perf_counter()
    logged = sampler.sample_once()
    elapsed_ms = 1000 * (time.perf_counter() - started)
    print(f"sampler: node {sink.inventory}; {logged} values in {elapsed_ms:.2f} ms (first pass, one sample)")
    for key, value in sorted(sink.metrics.items()):
        print(f"  {key} = {value}")
    sampler.close()


if __name__ == "__main__":
    sys.exit(main())
