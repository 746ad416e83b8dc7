"""The real NVML path, on a machine with NVIDIA GPUs: every pynvml call `rankboard.gpu` makes, one sampling pass as
the trainer's sampler makes it, and what each costs.

    .venv/bin/python bench/nvml_real.py [--repeats 200]

Ignores RANKBOARD_FAKE_NVML: this is the check that the fake's answers have the shapes the real library gives.
Prints each GPU's identity and values, then the median microseconds of each call, of one whole pass over all GPUs
(what the sampler does once a second), and of the Host page's read. Without NVML it says why and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
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
    }


def check_calls(nvml: gpu.Nvml, index: int, handle: Any, repeats: int) -> None:
    print(f"GPU {index}: {gpu.describe(nvml, index, handle)}")
    for name, call in calls(nvml, handle).items():
        try:
            answer = call()
        except nvml.NVMLError as error:  # e.g. power on a GPU that does not report it: the sampler skips it
            print(f"  {name:40s} raises {type(error).__name__}: {error}")
            continue
        print(f"  {name:40s} {median_us(call, repeats):8.1f} us  -> {answer!r}"[:200])
    values, errors = gpu.read_gpu(nvml, handle)
    print(f"  read_gpu: {values}" + (f"  failed: {errors}" if errors else ""))
    try:
        print(f"  processes (pid, bytes): {gpu.gpu_processes(nvml, handle)}")
    except nvml.NVMLError as error:
        print(f"  processes: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
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

        def one_pass() -> None:
            for _index, handle in handles:
                gpu.read_gpu(nvml, handle)
                with contextlib.suppress(nvml.NVMLError):  # as the sampler: a failed read skips, and goes on
                    gpu.gpu_processes(nvml, handle)

        print(f"one sampling pass over {len(handles)} GPU(s): median {median_us(one_pass, args.repeats):.1f} us")
    finally:
        nvml.nvmlShutdown()
    sampled_pass(real)
    host = HostSampler(real)
    print(f"Host page read (all GPUs, processes, CPU): median {median_us(host.read, args.repeats):.1f} us")
    host.close()
    return 0


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
