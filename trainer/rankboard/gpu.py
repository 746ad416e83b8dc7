"""Samples a node's GPUs through NVML into the run's metrics; without NVML, the node's CPU and memory instead.

The trainer starts it once on each node's local rank 0, after the reporter is usable:

    from rankboard import gpu, report
    sampler = gpu.start_sampling(report.default_reporter())  # None on other local ranks and outside a dashboard run
    ...
    if sampler is not None:
        sampler.stop()  # optional: it is a daemon thread

Every RANKBOARD_GPU_SAMPLE_S seconds (default 1, at least 1, because samples are keyed by whole unix seconds) it
reads, for each GPU this node's ranks use (CUDA_VISIBLE_DEVICES, else all): utilization, memory used and total,
temperature, power draw and limit, SM clock, and the memory that this run's own processes hold on it; and its health:
clock-event (throttle) reasons, ECC errors, remapped rows or pending page retirements, PCIe replays, NVLink errors,
Xid errors (drained from an NVML event set without waiting) and, once a minute, the total-energy counter. Each value
is a point `gpu/<host>/<index>/<field>` (see `wire.GPU_FIELDS`) at step = int(unix time), so a restarted trainer
never collides with its predecessor's samples, from this process's rank; the node's inventory (`wire.Node`) goes
with the next batch. Counters that seldom move are posted when they change (and every COUNTER_EVERY_S). A read the
GPU does not support (NVML_ERROR_NOT_SUPPORTED, or FUNCTION_NOT_FOUND from an old driver) is never made again for
that GPU; any other failed read is skipped with one warning: sampling never raises into training.

NVML is reached only through `Nvml`, the pynvml calls used here. `load_nvml()` gives the real `pynvml` or, when
RANKBOARD_FAKE_NVML names a JSON file, `gpu_fake.FakeNvml`, so machines without GPUs run this same code. The
server reads its own host's GPUs through the same functions (the Host page).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import wire
from .gpu_fake import FakeNvml

ENV_FAKE_NVML = "RANKBOARD_FAKE_NVML"
ENV_SAMPLE_S = "RANKBOARD_GPU_SAMPLE_S"
DEFAULT_SAMPLE_S = 1.0
MIN_SAMPLE_S = 1.0  # a step is a whole second: two samples in one second would be the same point
# Counters that seldom move (ECC, remapped rows, PCIe replays, NVLink errors) are read every pass but posted only when
# they change, and at least this often, so that a chart has points and the newest value is never old.
COUNTER_EVERY_S = 60
ENERGY_EVERY_S = 60  # nvmlDeviceGetTotalEnergyConsumption costs 3.9 ms on an H100 (NVML-H100.md): once a minute
PCIE_EVERY_S = 10  # nvmlDeviceGetPcieReplayCounter costs 149 us there, 100x any other read: every 10 s is enough
MAX_PENDING_XIDS = 100  # drained from NVML each pass, posted one a pass
REMAP_FIELDS = ("remap_corrected", "remap_uncorrected", "remap_pending", "remap_failure")
# nvmlDeviceGetNvLinkErrorCounter's counters, in the order of their numbers (NVML_NVLINK_ERROR_DL_*), summed over links.
NVLINK_FIELDS = ("nvlink_replay", "nvlink_recovery", "nvlink_crc_flit", "nvlink_crc_data", "nvlink_ecc_data")
# GPM's metrics sampled, by field: NVML_GPM_METRIC_SM_UTIL, _SM_OCCUPANCY, _ANY_TENSOR_UTIL, _DRAM_BW_UTIL.
GPM_METRICS = {"sm_active": 2, "sm_occupancy": 3, "tensor_active": 5, "dram_bw": 10}


class Utilization(Protocol):
    @property
    def gpu(self) -> int: ...
    @property
    def memory(self) -> int: ...


class Memory(Protocol):
    @property
    def total(self) -> int: ...
    @property
    def free(self) -> int: ...
    @property
    def used(self) -> int: ...


class ProcessInfo(Protocol):
    @property
    def pid(self) -> int: ...
    @property
    def usedGpuMemory(self) -> int | None: ...


class EventData(Protocol):
    @property
    def eventType(self) -> int: ...
    @property
    def eventData(self) -> int: ...


class Nvml(Protocol):
    """The pynvml calls this project makes, exactly as pynvml spells them; units: bytes, mW, MHz, °C."""

    @property
    def NVMLError(self) -> type[Exception]: ...
    @property
    def NVML_TEMPERATURE_GPU(self) -> int: ...
    @property
    def NVML_CLOCK_SM(self) -> int: ...
    @property
    def NVML_ERROR_NOT_SUPPORTED(self) -> int: ...
    @property
    def NVML_ERROR_FUNCTION_NOT_FOUND(self) -> int: ...
    @property
    def NVML_ERROR_INVALID_ARGUMENT(self) -> int: ...
    @property
    def NVML_ERROR_TIMEOUT(self) -> int: ...
    @property
    def NVML_MEMORY_ERROR_TYPE_CORRECTED(self) -> int: ...
    @property
    def NVML_MEMORY_ERROR_TYPE_UNCORRECTED(self) -> int: ...
    @property
    def NVML_VOLATILE_ECC(self) -> int: ...
    @property
    def NVML_AGGREGATE_ECC(self) -> int: ...
    @property
    def NVML_NVLINK_MAX_LINKS(self) -> int: ...
    @property
    def nvmlEventTypeXidCriticalError(self) -> int: ...
    @property
    def NVML_SUCCESS(self) -> int: ...
    @property
    def NVML_GPM_METRICS_GET_VERSION(self) -> int: ...
    @property
    def c_nvmlGpmMetricsGet_t(self) -> Callable[[], Any]: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Utilization: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Memory: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[ProcessInfo]: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int: ...
    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None: ...
    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> EventData: ...
    def nvmlEventSetFree(self, event_set: Any) -> None: ...
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any: ...
    def nvmlGpmSampleAlloc(self) -> Any: ...
    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any: ...
    def nvmlGpmSampleFree(self, sample: Any) -> None: ...
    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any: ...


class NvmlUnavailable(Exception):
    """NVML cannot be used on this host; the message is the reason, as the import or NVML gave it."""


def load_nvml(environ: Mapping[str, str] = os.environ) -> Nvml:
    """The pynvml module, or the fake that RANKBOARD_FAKE_NVML describes; raises NvmlUnavailable without either."""
    fake = environ.get(ENV_FAKE_NVML)
    if fake:
        return FakeNvml(fake)
    try:
        import pynvml
    except ImportError as error:
        raise NvmlUnavailable(f"the nvidia-ml-py package is not installed ({error})") from None
    return pynvml


def open_nvml(environ: Mapping[str, str] = os.environ) -> Nvml:
    """NVML loaded and initialised; raises NvmlUnavailable with the reason (no library, no driver, ...)."""
    nvml = load_nvml(environ)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML did not start: {error}") from None
    except (OSError, ValueError) as error:  # the fake's file is missing or not JSON
        raise NvmlUnavailable(f"NVML did not start: {type(error).__name__}: {error}") from None
    return nvml


def text(value: str | bytes) -> str:
    """pynvml before 11.5 answers names and UUIDs as bytes, later versions as str."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def visible_indices(nvml: Nvml, visible: str | None) -> list[int]:
    """NVML indices of the GPUs that CUDA_VISIBLE_DEVICES names (indices or UUID prefixes); all when it is unset.

    Like CUDA, the list ends at the first entry that names no GPU. Indices are NVML's, which are CUDA's only with
    CUDA_DEVICE_ORDER=PCI_BUS_ID, as launchers set it.
    """
    count = nvml.nvmlDeviceGetCount()
    if visible is None:
        return list(range(count))
    uuids: list[str] | None = None
    found: list[int] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit() and int(entry) < count:
            found.append(int(entry))
            continue
        if entry.startswith(("GPU-", "MIG-")):
            if uuids is None:
                uuids = [text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
            matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
            if len(matches) == 1:
                found.append(matches[0])
                continue
        break
    return list(dict.fromkeys(found))


def describe(nvml: Nvml, index: int, handle: Any) -> wire.Gpu:
    """The GPU's identity; a GPU that cannot say its name is still listed, so that its index is not lost."""
    try:
        return wire.Gpu(index, text(nvml.nvmlDeviceGetUUID(handle)), text(nvml.nvmlDeviceGetName(handle)))
    except nvml.NVMLError as error:
        return wire.Gpu(index, "", f"unreadable: {error}")


def _memory(info: Memory) -> tuple[float, ...]:
    return (float(info.used), float(info.total))


class NotSupported(Exception):
    """A reading this GPU cannot give (NVML said NOT_SUPPORTED, or an old driver lacks the function)."""


@dataclass
class GpuState:
    """What sampling has learnt about one GPU: the readings it does not support (never asked again), its NVLinks that
    do not answer, and its Xid event set with the Xids drained from it and not yet posted."""

    unsupported: set[str] = field(default_factory=set)
    silent_links: set[int] = field(default_factory=set)
    events: Any = None
    xids: deque[int] = field(default_factory=lambda: deque(maxlen=MAX_PENDING_XIDS))
    last_xid: int | None = None  # the newest Xid drained, for the Host page
    gpm_sample: Any = None  # the GPM sample of the previous pass: GPM's metrics are rates between two samples


def _code(error: Exception) -> int | None:
    return getattr(error, "value", None)


def _clock_reasons(nvml: Nvml, h: Any) -> int:
    # The newer name (driver 535+); an older driver has only the older one, for the same bitmask.
    try:
        return nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    except (nvml.NVMLError, AttributeError) as error:
        if isinstance(error, nvml.NVMLError) and _code(error) != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
        return nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)


def _ecc(nvml: Nvml, h: Any, uncorrected: bool, aggregate: bool) -> float:
    kind = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED if uncorrected else nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    counter = nvml.NVML_AGGREGATE_ECC if aggregate else nvml.NVML_VOLATILE_ECC
    return float(nvml.nvmlDeviceGetTotalEccErrors(h, kind, counter))


def _nvlink_errors(nvml: Nvml, h: Any, state: GpuState) -> dict[str, float]:
    """Each NVLink error counter summed over the GPU's links; a link that does not answer is not asked again."""
    sums = dict.fromkeys(NVLINK_FIELDS, 0.0)
    answered = False
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        if link in state.silent_links:
            continue
        try:
            counts = [nvml.nvmlDeviceGetNvLinkErrorCounter(h, link, c) for c in range(len(NVLINK_FIELDS))]
        except nvml.NVMLError as error:
            if _code(error) not in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                raise
            state.silent_links.add(link)
            continue
        answered = True
        for name, count in zip(NVLINK_FIELDS, counts, strict=True):
            sums[name] += count
    if not answered:
        raise NotSupported("no NVLink answers")
    return sums


def _xid(nvml: Nvml, h: Any, state: GpuState) -> dict[str, float]:
    """The oldest Xid not yet posted, after draining the GPU's event set (registered on first use; never waits)."""
    if state.events is None:
        events = nvml.nvmlEventSetCreate()
        try:
            nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
        except nvml.NVMLError:
            nvml.nvmlEventSetFree(events)
            raise
        state.events = events
    for _ in range(MAX_PENDING_XIDS):
        try:
            data = nvml.nvmlEventSetWait_v2(state.events, 0)
        except nvml.NVMLError as error:
            if _code(error) == nvml.NVML_ERROR_TIMEOUT:  # nothing pending
                break
            raise
        if data.eventType & nvml.nvmlEventTypeXidCriticalError:
            state.xids.append(int(data.eventData))
            state.last_xid = int(data.eventData)
    # One a pass: a point is keyed by its second, so two Xids in one second would be one point.
    return {"xid": float(state.xids.popleft())} if state.xids else {}


def _gpm(nvml: Nvml, h: Any, state: GpuState) -> dict[str, float]:
    """SM activity, SM occupancy, tensor pipe activity and DRAM bandwidth (%) between the previous pass and this one,
    from GPM (Hopper and later); nothing on the first pass, which only takes the first sample."""
    if state.gpm_sample is None and not _gpm_supported(nvml, h):
        raise NotSupported("no GPM")
    sample = nvml.nvmlGpmSampleAlloc()
    try:
        nvml.nvmlGpmSampleGet(h, sample)
    except nvml.NVMLError:
        nvml.nvmlGpmSampleFree(sample)
        raise
    previous, state.gpm_sample = state.gpm_sample, sample
    if previous is None:
        return {}
    try:
        asked = nvml.c_nvmlGpmMetricsGet_t()
        asked.version, asked.numMetrics = nvml.NVML_GPM_METRICS_GET_VERSION, len(GPM_METRICS)
        asked.sample1, asked.sample2 = previous, sample
        for i, metric in enumerate(GPM_METRICS.values()):
            asked.metrics[i].metricId = metric
        nvml.nvmlGpmMetricsGet(asked)
    finally:
        nvml.nvmlGpmSampleFree(previous)
    got = [(name, asked.metrics[i]) for i, name in enumerate(GPM_METRICS)]
    return {name: float(metric.value) for name, metric in got if metric.nvmlReturn == nvml.NVML_SUCCESS}


def _gpm_supported(nvml: Nvml, h: Any) -> bool:
    try:
        return bool(nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
    except AttributeError:  # a pynvml older than GPM
        return False


def free_gpm(nvml: Nvml, state: GpuState) -> None:
    """Lets the GPU's last GPM sample go (before nvmlShutdown)."""
    sample, state.gpm_sample = state.gpm_sample, None
    if sample is not None:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlGpmSampleFree(sample)


def _fields(names: tuple[str, ...], read: Callable[[Nvml, Any], Sequence[float]]) -> ReadFn:
    return lambda nvml, h, _state: dict(zip(names, (float(v) for v in read(nvml, h)), strict=True))


@dataclass(frozen=True)
class Reading:
    """One NVML read and the fields it gives; read one by one, so a field a GPU does not support loses only itself."""

    fields: tuple[str, ...]
    read: ReadFn
    every_s: int = 1  # a costly read (the energy counter: 3.9 ms on an H100) is made only this often
    counter: bool = False  # a count that seldom moves: posted when it changes, and at least every COUNTER_EVERY_S

    @property
    def name(self) -> str:
        return "/".join(self.fields)


ReadFn = Callable[[Nvml, Any, GpuState], dict[str, float]]


def _readings() -> tuple[Reading, ...]:
    def one(name: str, read: Callable[[Nvml, Any], float], **how: Any) -> Reading:
        return Reading((name,), _fields((name,), lambda nvml, h: (read(nvml, h),)), **how)

    return (
        one("util", lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h).gpu),
        Reading(("mem_used", "mem_total"), _fields(("mem_used", "mem_total"),
                                                   lambda nvml, h: _memory(nvml.nvmlDeviceGetMemoryInfo(h)))),
        one("temp", lambda nvml, h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
        one("power", lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) / 1000),  # mW -> W
        one("power_limit", lambda nvml, h: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000),
        one("sm_clock", lambda nvml, h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
        one("throttle", _clock_reasons),
        one("ecc_sbe_volatile", lambda nvml, h: _ecc(nvml, h, False, False), counter=True),
        one("ecc_dbe_volatile", lambda nvml, h: _ecc(nvml, h, True, False), counter=True),
        one("ecc_sbe_aggregate", lambda nvml, h: _ecc(nvml, h, False, True), counter=True),
        one("ecc_dbe_aggregate", lambda nvml, h: _ecc(nvml, h, True, True), counter=True),
        Reading(REMAP_FIELDS, _fields(REMAP_FIELDS, lambda nvml, h: nvml.nvmlDeviceGetRemappedRows(h)), counter=True),
        one("retired_pending", lambda nvml, h: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h), counter=True),
        one("pcie_replay", lambda nvml, h: nvml.nvmlDeviceGetPcieReplayCounter(h), counter=True,
            every_s=PCIE_EVERY_S),
        Reading(NVLINK_FIELDS, _nvlink_errors, counter=True),
        one("energy", lambda nvml, h: nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000,  # mJ -> J
            every_s=ENERGY_EVERY_S),
        Reading(("xid",), _xid),
        Reading(tuple(GPM_METRICS), _gpm),
    )  # fmt: skip


READINGS = _readings()


def read_gpu(
    nvml: Nvml, handle: Any, state: GpuState | None = None, readings: Sequence[Reading] = READINGS
) -> tuple[dict[str, float], dict[str, str]]:
    """The GPU's current values by field (`wire.GPU_FIELDS` units), and why each field that failed did. A reading
    the GPU does not support goes into `state.unsupported` and is never made again with that state."""
    state = GpuState() if state is None else state
    values: dict[str, float] = {}
    errors: dict[str, str] = {}
    for reading in readings:
        if reading.name in state.unsupported:
            continue
        try:
            values.update(reading.read(nvml, handle, state))
        except NotSupported:
            state.unsupported.add(reading.name)
        except nvml.NVMLError as error:
            if _code(error) in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                state.unsupported.add(reading.name)
            else:
                errors[reading.name] = str(error)
    return values, errors


def free_state(nvml: Nvml, state: GpuState) -> None:
    """Lets what NVML holds for the GPU go, its Xid event set and its GPM sample (before nvmlShutdown)."""
    free_gpm(nvml, state)
    events, state.events = state.events, None
    if events is not None:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlEventSetFree(events)


def gpu_processes(nvml: Nvml, handle: Any) -> list[tuple[int, int]]:
    """(pid, bytes of GPU memory) of each compute process on the GPU; pids are as the driver's namespace sees them."""
    return [(p.pid, p.usedGpuMemory or 0) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]


def system_values() -> dict[str, float]:
    """CPU busy percent (since the previous call) and memory used and total; empty without psutil."""
    try:
        import psutil
    except ImportError:
        return {}
    return {"cpu_percent": psutil.cpu_percent(interval=None), **memory_values()}


def memory_values() -> dict[str, float]:
    """This host's memory used and total; empty without psutil."""
    try:
        import psutil
    except ImportError:
        return {}
    memory = psutil.virtual_memory()
    return {"mem_used": memory.used, "mem_total": memory.total}


class RunProcesses:
    """Tells whether a pid is one of this run's processes: its environment has this launch's id, or, outside a
    launcher, it is this process or a descendant of this process's parent (torchrun's agent). Answers per pid are
    remembered, because NVML lists the same few pids every second."""

    def __init__(self, launch_id: str | None) -> None:
        self.launch_id = launch_id
        self._known: dict[int, bool] = {}

    def __contains__(self, pid: object) -> bool:
        if not isinstance(pid, int):
            return False
        if pid not in self._known:
            if len(self._known) > 4096:
                self._known.clear()
            self._known[pid] = self._belongs(pid)
        return self._known[pid]

    def _belongs(self, pid: int) -> bool:
        if pid == os.getpid():
            return True
        try:
            import psutil

            process = psutil.Process(pid)
            if self.launch_id:
                return process.environ().get(wire.ENV_LAUNCH_ID) == self.launch_id
            return os.getppid() in {parent.pid for parent in process.parents()}
        except Exception:  # no psutil, gone, or another user's: not ours to count
            return False


class Sink(Protocol):
    """Where samples go: a `report.Reporter`."""

    def sample(self, metrics: Mapping[str, float], *, step: int) -> None: ...
    def node(self, node: wire.Node) -> None: ...


class GpuSampler:
    """Samples this node's GPUs, or without NVML its CPU and memory, into a sink from a daemon thread."""

    def __init__(
        self,
        sink: Sink,
        *,
        host: str | None = None,
        interval: float = DEFAULT_SAMPLE_S,
        visible_devices: str | None = None,
        launch_id: str | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        if interval < MIN_SAMPLE_S:
            raise ValueError(f"interval must be at least {MIN_SAMPLE_S} s, got {interval}")
        self.host = host or wire.node_name(environ, socket.gethostname())
        self.interval = interval
        self._sink, self._visible, self._environ = sink, visible_devices, environ
        self._run_processes = RunProcesses(launch_id)
        self._nvml: Nvml | None = None
        self._gpus: list[tuple[wire.Gpu, Any]] = []
        self.states: dict[int, GpuState] = {}  # by NVML index: what each GPU does not support, its Xid events
        self._read_at: dict[str, int] = {}  # reading -> the step it was last made at (those not made every pass)
        self._posted: dict[str, tuple[float, int]] = {}  # a counter's key -> (value, step) last posted
        self.node: wire.Node | None = None  # what open() found; None until then
        self._last_step = -1
        self._closed = False
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rankboard-gpu-sampler", daemon=True)

    def start(self) -> GpuSampler:
        """Starts the thread; it opens NVML itself, so that this returns at once."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Ends the thread and lets NVML go."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._guarded(self._last_energy)
        self.close()

    def _last_energy(self) -> None:
        """The energy counter once more as sampling ends, so that a run's energy spans all of it."""
        step = int(time.time())
        if self._nvml is None or self._closed or step <= self._last_step:
            return  # sampled this very second: that sample is as late as this one would be
        self._last_step = step
        energy = [reading for reading in READINGS if reading.fields == ("energy",)]
        metrics = {}
        for gpu, handle in self._gpus:
            values, _errors = read_gpu(self._nvml, handle, self.states.setdefault(gpu.index, GpuState()), energy)
            metrics.update(
                {wire.GPU_KEY.format(host=self.host, index=gpu.index, field=f): v for f, v in values.items()}
            )
        if metrics:
            self._sink.sample(metrics, step=step)

    def close(self) -> None:
        """Shuts NVML down; sample_once() after it samples nothing."""
        self._closed = True
        nvml, self._nvml, self._gpus = self._nvml, None, []
        if nvml is not None:
            for state in self.states.values():
                free_state(nvml, state)
            try:
                nvml.nvmlShutdown()
            except Exception as error:
                self._warn("shutdown", f"NVML shutdown failed: {error}")

    def _run(self) -> None:
        self._guarded(self.open)
        if self._nvml is None:  # the first CPU percent spans the time since open() primed it: let that be an interval
            self._stop.wait(self.interval)
        while not self._stop.is_set():
            self._guarded(self.sample_once)
            self._stop.wait(self.interval)

    def open(self) -> wire.Node:
        """Opens NVML and finds the GPUs to sample; tells the sink which, or why there are none."""
        error: str | None = None
        try:
            nvml = open_nvml(self._environ)
        except NvmlUnavailable as unavailable:
            error = str(unavailable)
        else:
            try:
                handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in visible_indices(nvml, self._visible)]
                self._gpus = [(describe(nvml, i, handle), handle) for i, handle in handles]
                self._nvml = nvml
            except nvml.NVMLError as failure:  # the node has GPUs NVML cannot list: sample it as one without
                error = f"NVML failed while listing GPUs: {failure}"
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()
        if error is not None:
            error = error[: wire.MAX_NVML_ERROR_LENGTH]
            self._warn("nvml", f"no GPU sampling on {self.host} ({error}); sampling CPU and memory instead")
            system_values()  # psutil's CPU percent is "since the last call": the first sample would say 0
        self.node = wire.Node(self.host, tuple(gpu for gpu, _handle in self._gpus), error)
        self._sink.node(self.node)
        return self.node

    def sample_once(self) -> int:
        """Reads every value once and logs them at step = this unix second; returns how many values it logged."""
        step = int(time.time())
        if step <= self._last_step or self._closed:
            return 0  # already sampled this second, or stopped
        self._last_step = step
        metrics = self._gpu_metrics(step) if self._nvml is not None else self._system_metrics()
        if metrics:
            self._sink.sample(metrics, step=step)  # at a clock's step: the script's log() counter stays its own
        return len(metrics)

    def _due(self, step: int) -> list[Reading]:
        """The readings to make this pass: all but the costly ones, which wait for their period."""
        due = [r for r in READINGS if r.every_s <= 1 or step - self._read_at.get(r.name, -r.every_s) >= r.every_s]
        self._read_at.update((r.name, step) for r in due if r.every_s > 1)
        return due

    def _changed(self, key: str, value: float, step: int) -> bool:
        """Whether a counter's point is worth posting: it moved, or it was last posted COUNTER_EVERY_S ago."""
        last = self._posted.get(key)
        if last is not None and last[0] == value and step - last[1] < COUNTER_EVERY_S:
            return False
        self._posted[key] = (value, step)
        return True

    def _gpu_metrics(self, step: int) -> dict[str, float]:
        nvml = self._nvml
        assert nvml is not None
        metrics: dict[str, float] = {}
        due = self._due(step)
        counters = {name for reading in due if reading.counter for name in reading.fields}
        for gpu, handle in self._gpus:
            values, errors = read_gpu(nvml, handle, self.states.setdefault(gpu.index, GpuState()), due)
            try:
                values["run_mem"] = float(
                    sum(m for pid, m in gpu_processes(nvml, handle) if pid in self._run_processes)
                )
            except nvml.NVMLError as error:
                errors["run_mem"] = str(error)
            for reason in dict.fromkeys(errors.values()):  # a lost GPU fails every field: one line, not seven
                fields = ", ".join(field for field, why in errors.items() if why == reason)
                self._warn(f"{gpu.index}/{reason}", f"cannot read {fields} of GPU {gpu.index} on {self.host}: {reason}")
            for name, value in values.items():
                key = wire.GPU_KEY.format(host=self.host, index=gpu.index, field=name)
                if name not in counters or self._changed(key, value, step):
                    metrics[key] = value
        return metrics

    def _system_metrics(self) -> dict[str, float]:
        values = system_values()
        if not values:
            self._warn("psutil", "psutil is not installed: no CPU or memory samples either")
        return {wire.SYS_KEY.format(host=self.host, field=field): value for field, value in values.items()}

    def _guarded(self, work: Callable[[], object]) -> None:
        # The sampler must outlive anything NVML or the sink throws, and never take the training down with it.
        try:
            work()
        except Exception as error:
            self._warn(f"bug {type(error).__name__}", f"GPU sampler error, carrying on: {error!r}")

    def _warn(self, topic: str, message: str) -> None:
        if topic not in self._warned:
            self._warned.add(topic)
            print(f"rankboard: [gpu] {message}", file=sys.stderr, flush=True)


def sample_interval(environ: Mapping[str, str] = os.environ) -> float:
    """RANKBOARD_GPU_SAMPLE_S, or the default when unset or not a number; at least MIN_SAMPLE_S."""
    interval, problem = wire.seconds_from_env(environ, ENV_SAMPLE_S, DEFAULT_SAMPLE_S, MIN_SAMPLE_S)
    if problem:
        print(f"rankboard: [gpu] {problem}; sampling every {interval:g} s", file=sys.stderr, flush=True)
    return interval


def start_sampling(
    reporter: Sink | None, *, host: str | None = None, environ: Mapping[str, str] = os.environ
) -> GpuSampler | None:
    """Starts sampling this node's GPUs into `reporter`'s run; only on local rank 0, and only inside a dashboard run
    (`reporter` None: the process's own, `report.default_reporter()`, said it is in none). Returns None where nothing
    samples. The reporter comes from the caller: the client imports this module, never the other way round.
    """
    if environ.get("LOCAL_RANK", "0") != "0" or reporter is None:
        return None
    sampler = GpuSampler(
        reporter,
        host=host,
        interval=sample_interval(environ),
        visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        launch_id=environ.get(wire.ENV_LAUNCH_ID),
        environ=environ,
    )
    return sampler.start()
