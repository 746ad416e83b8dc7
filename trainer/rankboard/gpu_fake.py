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
               "broken": false,            # true: every read of that GPU raises NVMLError_GPUIsLost
               # Health, as NVML answers it; a GPU without a key answers NVML_ERROR_NOT_SUPPORTED for that call:
               "ecc": {"corrected_volatile": 0, "uncorrected_volatile": 0,
                       "corrected_aggregate": 3, "uncorrected_aggregate": 0},
               "remapped_rows": [0, 0, 0, 0],   # corrected, uncorrected, pending, failure
               "retired_pages_pending": 0,
               "clocks_event_reasons": 4,       # nvmlClocksEventReason* bits
               "pcie_replay": 0,
               "nvlink_errors": [[0, 0, 0, 0, 0]],  # per link, per NVML_NVLINK_ERROR_DL_* counter
               "energy": 123456789,             # mJ since the driver loaded ...
               "energy_at": 1760000000.0,       # ... at this unix time, growing at `power` since (optional)
               "xid_supported": true,           # false: registering for Xid events is not supported
               "gpm": {"2": 95.8, "3": 14.2, "5": 93.0, "10": 23.6}}],  # GPM metric id -> value; none: no GPM
     "xid_events": [{"index": 0, "xid": 79, "at": 1760000000.0}]}  # delivered to event sets once `at` has passed
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

# pynvml's error codes and constants, with the same values.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_NVLINK_MAX_LINKS = 18  # pynvml's constant says 36; each GPU answers for its own links only
NVML_NVLINK_ERROR_COUNT = 5
nvmlEventTypeXidCriticalError = 0x8
NVML_SUCCESS = 0
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_MAX = 477
ECC_KEYS = {(0, 0): "corrected_volatile", (1, 0): "uncorrected_volatile",
            (0, 1): "corrected_aggregate", (1, 1): "uncorrected_aggregate"}  # (error type, counter type)  # fmt: skip

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
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


@dataclass(frozen=True)
class Handle:
    index: int


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_Timeout(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_TIMEOUT)


class EventData(NamedTuple):
    device: Handle
    eventType: int
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int


@dataclass
class EventSet:
    """The GPUs registered with it, and the Xid events it has delivered (by their place in the file's list)."""

    devices: set[int] = field(default_factory=set)
    delivered: set[tuple[int, int, float]] = field(default_factory=set)
    freed: bool = False


@dataclass
class GpmSample:
    """An opaque GPM sample: which GPU it was taken of, and when."""

    index: int | None = None
    at: float | None = None
    freed: bool = False


@dataclass
class GpmMetric:
    metricId: int = 0
    nvmlReturn: int = NVML_SUCCESS
    value: float = 0.0


class GpmMetrics(dict[int, GpmMetric]):
    """The structure's array of NVML_GPM_METRIC_MAX metrics, each made when first indexed (most are never used)."""

    def __missing__(self, index: int) -> GpmMetric:
        if not 0 <= index < NVML_GPM_METRIC_MAX:
            raise IndexError(index)
        self[index] = GpmMetric()
        return self[index]


@dataclass
class GpmMetricsGet:
    """pynvml's c_nvmlGpmMetricsGet_t (a ctypes structure), as plain attributes: the caller fills version,
    numMetrics, the samples and each metric's id; nvmlGpmMetricsGet fills each metric's nvmlReturn and value."""

    version: int = 0
    numMetrics: int = 0
    sample1: GpmSample | None = None
    sample2: GpmSample | None = None
    metrics: GpmMetrics = field(default_factory=lambda: GpmMetrics())


@dataclass(frozen=True)
class GpmSupport:
    version: int
    isSupportedDevice: int


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


class FakeNvml:
    """pynvml's calls that `rankboard.gpu` makes, answered from the JSON file at `path`."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_MEMORY_ERROR_TYPE_CORRECTED = NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = NVML_AGGREGATE_ECC
    NVML_NVLINK_MAX_LINKS = NVML_NVLINK_MAX_LINKS
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
    NVML_SUCCESS = NVML_SUCCESS
    NVML_GPM_METRICS_GET_VERSION = NVML_GPM_METRICS_GET_VERSION
    c_nvmlGpmMetricsGet_t = GpmMetricsGet

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.calls: Counter[str] = Counter()  # the health calls made, by name: a test sees what is asked again
        self.gpm_samples = 0  # allocated and not yet freed
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

    def _health(self, handle: Handle, call: str, key: str) -> Any:
        """The GPU's value of a health call, counted; NOT_SUPPORTED where its description lacks the key."""
        self.calls[call] += 1
        gpu = self._gpu(handle)
        if key not in gpu:
            raise NVMLError_NotSupported()
        return gpu[key]

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, errorType: int, counterType: int) -> int:
        ecc = self._health(handle, "nvmlDeviceGetTotalEccErrors", "ecc")
        if (errorType, counterType) not in ECC_KEYS:
            raise NVMLError_InvalidArgument()
        return int(ecc.get(ECC_KEYS[errorType, counterType], 0))

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        rows = self._health(handle, "nvmlDeviceGetRemappedRows", "remapped_rows")
        corrected, uncorrected, pending, failure = (int(n) for n in rows)
        return corrected, uncorrected, pending, failure

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        return int(self._health(handle, "nvmlDeviceGetRetiredPagesPendingStatus", "retired_pages_pending"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        return int(self._health(handle, "nvmlDeviceGetCurrentClocksEventReasons", "clocks_event_reasons"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int:
        return int(self._health(handle, "nvmlDeviceGetCurrentClocksThrottleReasons", "clocks_event_reasons"))

    def nvmlDeviceGetPcieReplayCounter(self, handle: Handle) -> int:
        return int(self._health(handle, "nvmlDeviceGetPcieReplayCounter", "pcie_replay"))

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Handle, link: int, counter: int) -> int:
        links = self._health(handle, "nvmlDeviceGetNvLinkErrorCounter", "nvlink_errors")
        if not 0 <= link < len(links) or not 0 <= counter < NVML_NVLINK_ERROR_COUNT:
            raise NVMLError_NotSupported() if 0 <= counter < NVML_NVLINK_ERROR_COUNT else NVMLError_InvalidArgument()
        return int(links[link][counter])

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Handle) -> int:
        energy = int(self._health(handle, "nvmlDeviceGetTotalEnergyConsumption", "energy"))
        since = self._gpu(handle).get("energy_at")
        if since is None:
            return energy
        power_mw = int(self._gpu(handle).get("power", 100_000))
        return energy + int(power_mw * max(0.0, time.time() - float(since)))  # mW x s = mJ

    def nvmlEventSetCreate(self) -> EventSet:
        self._gpus()  # raises as NVML does before nvmlInit
        return EventSet()

    def nvmlDeviceRegisterEvents(self, handle: Handle, eventTypes: int, eventSet: EventSet) -> None:
        self.calls["nvmlDeviceRegisterEvents"] += 1
        if not self._gpu(handle).get("xid_supported", True) or eventTypes & ~nvmlEventTypeXidCriticalError:
            raise NVMLError_NotSupported()
        eventSet.devices.add(handle.index)

    def nvmlEventSetWait_v2(self, eventSet: EventSet, timeoutms: int) -> EventData:
        self.calls["nvmlEventSetWait_v2"] += 1
        if eventSet.freed:
            raise NVMLError_InvalidArgument()
        now = time.time()
        for event in self._current().get("xid_events", []):
            seen = (int(event["index"]), int(event["xid"]), float(event["at"]))
            if seen[0] in eventSet.devices and seen[2] <= now and seen not in eventSet.delivered:
                eventSet.delivered.add(seen)
                return EventData(Handle(seen[0]), nvmlEventTypeXidCriticalError, seen[1], 0xFFFFFFFF, 0xFFFFFFFF)
        if timeoutms > 0:
            time.sleep(timeoutms / 1000)  # as NVML, waits the whole timeout when nothing comes
        raise NVMLError_Timeout()

    def nvmlEventSetFree(self, eventSet: EventSet) -> None:
        eventSet.freed = True

    def nvmlGpmQueryDeviceSupport(self, handle: Handle) -> GpmSupport:
        self.calls["nvmlGpmQueryDeviceSupport"] += 1
        return GpmSupport(version=1, isSupportedDevice=int("gpm" in self._gpu(handle)))

    def nvmlGpmSampleAlloc(self) -> GpmSample:
        self._gpus()
        self.gpm_samples += 1
        return GpmSample()

    def nvmlGpmSampleFree(self, gpmSample: GpmSample) -> None:
        if gpmSample.freed:
            raise NVMLError_InvalidArgument()
        gpmSample.freed = True
        self.gpm_samples -= 1

    def nvmlGpmSampleGet(self, device: Handle, gpmSample: GpmSample) -> GpmSample:
        self.calls["nvmlGpmSampleGet"] += 1
        if "gpm" not in self._gpu(device):
            raise NVMLError_NotSupported()
        gpmSample.index, gpmSample.at = device.index, time.time()
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: GpmMetricsGet) -> GpmMetricsGet:
        first, second = metricsGet.sample1, metricsGet.sample2
        if metricsGet.version != NVML_GPM_METRICS_GET_VERSION or first is None or second is None:
            raise NVMLError_InvalidArgument()
        if first.freed or second.freed or first.index is None or first.index != second.index:
            raise NVMLError_InvalidArgument()
        values = self._gpu(Handle(first.index)).get("gpm", {})
        for metric in (metricsGet.metrics[i] for i in range(metricsGet.numMetrics)):
            known = str(metric.metricId) in values
            metric.nvmlReturn = NVML_SUCCESS if known else NVML_ERROR_NOT_SUPPORTED
            metric.value = float(values[str(metric.metricId)]) if known else 0.0
        return metricsGet
