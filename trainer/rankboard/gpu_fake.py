"""A stand-in for `pynvml`, described by a JSON file, so that machines without GPUs (CI) can run the GPU paths.

`rankboard.gpu.load_nvml()` returns one when RANKBOARD_FAKE_NVML names such a file; nothing else makes one. It answers
the same calls as pynvml with values of the same types and units (bytes, mW, MHz, °C) and raises the same kind of
NVMLError, so the code that reads it is the code that reads a real GPU. The file is read again whenever it changes,
so a test can break a GPU, or take NVML away, while a sampler runs:

    {"library": "missing",                 # optional: nvmlInit fails as it does without a driver
     "gpus": [{"uuid": "GPU-0f0f...", "name": "NVIDIA H100 80GB HBM3",
               "util": [10, 60, 95],       # a number, or a pattern stepped through once a second
               "memory_used": 1073741824, "memory_total": 85899345920,
               "temp": 41, "power": 250000, "power_limit": 700000, "sm_clock": 1980,
               "processes": [{"pid": 4242, "used_memory": 536870912}],
               "broken": false}]}          # true: every read of that GPU raises NVMLError_GPUIsLost
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

# pynvml's error codes and constants, with the same values.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    """As pynvml's: `value` is NVML's error code and str() its message."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


class NVMLError_Uninitialized(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_UNINITIALIZED)


class NVMLError_InvalidArgument(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_INVALID_ARGUMENT)


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


class NVMLError_GPUIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_GPU_IS_LOST)


class Utilization(NamedTuple):
    gpu: int
    memory: int


class Memory(NamedTuple):
    total: int
    free: int
    used: int


class ProcessInfo(NamedTuple):
    pid: int
    usedGpuMemory: int | None


@dataclass(frozen=True)
class Handle:
    index: int


class FakeNvml:
    """pynvml's calls that `rankboard.gpu` makes, answered from the JSON file at `path`."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = NVML_CLOCK_SM

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._spec: dict[str, Any] = {}
        self._version: tuple[int, int] | None = None
        self._initialized = 0

    def _gpus(self) -> list[dict[str, Any]]:
        if not self._initialized:
            raise NVMLError_Uninitialized()
        return list(self._current().get("gpus", []))

    def _current(self) -> dict[str, Any]:
        stat = self.path.stat()
        version = (stat.st_mtime_ns, stat.st_size)  # the size too: two writes may share a coarse timestamp
        if version != self._version:
            self._spec, self._version = json.loads(self.path.read_text()), version
        return self._spec

    def _gpu(self, handle: Handle) -> dict[str, Any]:
        gpus = self._gpus()
        if not 0 <= handle.index < len(gpus):  # the file lost a GPU since the handle was made
            raise NVMLError_InvalidArgument()
        gpu = gpus[handle.index]
        if gpu.get("broken"):
            raise NVMLError_GPUIsLost()
        return gpu

    def nvmlInit(self) -> None:
        if self._current().get("library") == "missing":
            raise NVMLError_LibraryNotFound()
        self._initialized += 1

    def nvmlShutdown(self) -> None:
        if not self._initialized:
            raise NVMLError_Uninitialized()
        self._initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        if not 0 <= index < len(self._gpus()):
            raise NVMLError_InvalidArgument()
        return Handle(index)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        return str(self._gpu(handle).get("uuid", f"GPU-fake-{handle.index}"))

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        return str(self._gpu(handle).get("name", "Fake GPU"))

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Utilization:
        util = self._gpu(handle).get("util", 0)
        if isinstance(util, list):  # a pattern, one value a second, so charts visibly move
            util = util[int(time.time()) % len(util)] if util else 0
        return Utilization(gpu=int(util), memory=int(util) // 2)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> Memory:
        gpu = self._gpu(handle)
        total, used = int(gpu.get("memory_total", 80 * 2**30)), int(gpu.get("memory_used", 0))
        return Memory(total=total, free=total - used, used=used)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        return int(self._gpu(handle).get("temp", 40))

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return int(self._gpu(handle).get("power", 100_000))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:
        return int(self._gpu(handle).get("power_limit", 700_000))

    def nvmlDeviceGetClockInfo(self, handle: Handle, clock_type: int) -> int:
        if clock_type != NVML_CLOCK_SM:
            raise NVMLError_InvalidArgument()
        return int(self._gpu(handle).get("sm_clock", 1980))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:
        processes = self._gpu(handle).get("processes", [])
        return [ProcessInfo(pid=int(p["pid"]), usedGpuMemory=p.get("used_memory")) for p in processes]
