"""This server's own host, now: each GPU, its load, and which run holds it; CPU and memory where NVML finds none.

It reads NVML through `rankboard.gpu`, the interface the trainer's sampler uses, so the fake NVML that CI runs on
serves both. NVML is opened once per app and read under a lock: the routes that call this are sync functions,
which FastAPI runs in its threadpool, so a slow NVML call never holds up the event loop, and two requests never
read NVML at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankboard import gpu, wire
from sqlalchemy.orm import Session

from app.core.models import Run, RunStatus
from app.schemas.host import GpuHealthOut, GpuHolderOut, GpuProcessOut, HostGpuOut, HostOut
from app.store import runs as run_store

HOLDS_GPUS = (RunStatus.starting, RunStatus.running, RunStatus.stopping)
# The health readings the page names when a GPU lacks them (gpu.Reading.name -> words).
HEALTH_READINGS = {
    "throttle": "clock-event reasons",
    "ecc_sbe_volatile": "ECC",
    "/".join(gpu.REMAP_FIELDS): "row remapping",
    "retired_pending": "page retirement",
    "pcie_replay": "PCIe replay counter",
    "/".join(gpu.NVLINK_FIELDS): "NVLink error counters",
    "energy": "energy counter",
    "xid": "Xid events",
    "/".join(gpu.GPM_METRICS): "GPM metrics",
}
CPU_MIN_INTERVAL_S = 0.5  # psutil advises at least 0.1 s between the readings a CPU percent is measured over
CPU_MAX_INTERVAL_S = 10.0  # a percent over a longer interval (the page was closed) describes the past, not now


@dataclass(frozen=True)
class GpuNow:
    """One GPU as NVML read it just now."""

    gpu: wire.Gpu
    values: dict[str, float]
    errors: dict[str, str]
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)
    unsupported: set[str] = field(default_factory=set)  # readings the GPU does not have (gpu.Reading.name)
    last_xid: int | None = None  # the newest Xid seen since this server began watching the GPU


@dataclass(frozen=True)
class HostNow:
    """The host as read just now: its GPUs, or why there are none, and CPU and memory."""

    gpus: list[GpuNow]
    nvml_error: str | None
    system: dict[str, float]


class HostSampler:
    """Reads this host's GPUs on demand, with NVML opened on first use and kept open."""

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        self._environ = environ
        self._lock = threading.Lock()
        self._opened = False
        self._nvml: gpu.Nvml | None = None
        self._error: str | None = None
        self._cpu = CpuBusy()
        self._states: dict[int, gpu.GpuState] = {}  # by index: what each GPU lacks, its Xid events

    def read(self) -> HostNow:
        """Every GPU's values and processes; a GPU or a value that fails to read says why and the rest go on."""
        with self._lock:
            if not self._opened:
                self._open()
            nvml = self._nvml
            if nvml is None:
                return HostNow([], self._error, self._system())
            try:
                count = nvml.nvmlDeviceGetCount()
                gpus = [
                    _read_one(nvml, index, self._states.setdefault(index, gpu.GpuState())) for index in range(count)
                ]
            except nvml.NVMLError as error:
                return HostNow([], f"NVML failed while listing GPUs: {error}", self._system())
            return HostNow(gpus, None, self._system())

    def _system(self) -> dict[str, float]:
        values = gpu.memory_values()
        busy = self._cpu.read()
        return values if busy is None else {**values, "cpu_percent": busy}

    def _open(self) -> None:
        try:
            self._nvml = gpu.open_nvml(self._environ)
        except gpu.NvmlUnavailable as error:
            self._error = str(error)
        self._opened = True

    def close(self) -> None:
        """Lets NVML go; the next read opens it again."""
        with self._lock:
            if self._nvml is not None:
                for state in self._states.values():
                    gpu.free_state(self._nvml, state)
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlShutdown()
            self._nvml, self._error, self._opened, self._states = None, None, False, {}


class CpuBusy:
    """This host's CPU busy percent, only ever measured over a real interval.

    Not psutil's `cpu_percent(interval=None)`: its "since the previous call" is per thread, and the routes run in
    a threadpool, so a request on a thread that has not asked before measures nothing and says 0 while every core is
    busy. Here the first read only starts the interval and answers None ("measuring"); later reads answer the
    percent since the previous measurement, taken at most every CPU_MIN_INTERVAL_S, so that requests close
    together neither measure a few milliseconds nor restart the interval. After CPU_MAX_INTERVAL_S without a read
    the interval starts again. Callers serialise reads (HostSampler's lock).
    """

    def __init__(self) -> None:
        self._since: float | None = None
        self._times: tuple[float, float] = (0.0, 0.0)  # (busy, total) CPU seconds at `_since`
        self._percent: float | None = None

    def read(self) -> float | None:
        """The percent over the last interval measured, or None before one has passed (or without psutil)."""
        try:
            import psutil
        except ImportError:
            return None
        now, times = time.monotonic(), _busy_and_total(psutil.cpu_times())
        if self._since is None or now - self._since > CPU_MAX_INTERVAL_S:
            self._since, self._times, self._percent = now, times, None
        elif now - self._since >= CPU_MIN_INTERVAL_S:
            busy, total = times[0] - self._times[0], times[1] - self._times[1]
            self._percent = 100 * busy / total if total > 0 else self._percent
            self._since, self._times = now, times
        return self._percent


def _busy_and_total(times: Any) -> tuple[float, float]:
    """CPU seconds spent busy, and in all, as psutil counts them (guest time is already in user time on Linux)."""
    fields: dict[str, float] = times._asdict()
    total = sum(fields.values()) - fields.get("guest", 0.0) - fields.get("guest_nice", 0.0)
    return total - fields["idle"] - fields.get("iowait", 0.0), total


def _read_one(nvml: gpu.Nvml, index: int, state: gpu.GpuState) -> GpuNow:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    values, errors = gpu.read_gpu(nvml, handle, state)
    try:
        processes = gpu.gpu_processes(nvml, handle)
    except nvml.NVMLError as error:
        processes, errors["processes"] = [], str(error)
    unsupported = set(state.unsupported)
    return GpuNow(gpu.describe(nvml, index, handle), values, errors, processes, unsupported, state.last_xid)


def host_status(db: Session, *, sampler: HostSampler) -> HostOut:
    """The host now, each GPU with the runs that hold it: by the devices they were given, or by their processes."""
    now = sampler.read()  # before the transaction: NVML may be slow, and a read transaction need not wait on it
    with db.begin():
        active = list(run_store.runs_with_status(db, HOLDS_GPUS))
        owners = process_owners({pid for g in now.gpus for pid, _memory in g.processes}, active)
        gpus = [_gpu_out(g, active, owners) for g in now.gpus]
    return HostOut(
        host=socket.gethostname(),
        nvml_error=now.nvml_error,
        gpus=gpus,
        cpu_percent=now.system.get("cpu_percent"),
        mem_used=now.system.get("mem_used"),
        mem_total=now.system.get("mem_total"),
    )


def _gpu_out(now: GpuNow, active: Sequence[Run], owners: dict[int, Run]) -> HostGpuOut:
    holders = {run.id: _holder(run, by_devices=True) for run in active if now.gpu.index in (run.devices or [])}
    for pid, memory in now.processes:
        if pid in owners:
            owner = owners[pid]
            holders.setdefault(owner.id, _holder(owner, by_devices=False)).memory += memory
    processes = [
        GpuProcessOut(pid=pid, memory=memory, run_id=_run_id(owners.get(pid))) for pid, memory in now.processes
    ]
    return HostGpuOut(
        index=now.gpu.index,
        uuid=now.gpu.uuid,
        name=now.gpu.name,
        **{name: now.values.get(name) for name in wire.GPU_FIELDS if name not in ("run_mem", "xid")},
        processes=processes,
        held_by=sorted(holders.values(), key=lambda holder: holder.run_id),
        errors=now.errors,
        health=_health(now),
    )


def _health(now: GpuNow) -> GpuHealthOut:
    """The GPU's health in words: what throttles it now, its newest Xid, what it cannot report."""
    bits = int(now.values.get("throttle", 0))
    reasons = sorted({words for bit, (_, words) in wire.CLOCK_REASONS.items() if bits & bit})
    unsupported = sorted(HEALTH_READINGS[name] for name in now.unsupported if name in HEALTH_READINGS)
    xid = now.last_xid
    return GpuHealthOut(throttle_reasons=reasons, xid=xid, xid_meaning=None if xid is None else wire.xid_meaning(xid),
                        not_supported=unsupported)  # fmt: skip


def _holder(run: Run, *, by_devices: bool) -> GpuHolderOut:
    return GpuHolderOut(run_id=run.id, name=run.name, status=run.status, by_devices=by_devices, memory=0)


def _run_id(run: Run | None) -> int | None:
    return None if run is None else run.id


def process_owners(pids: set[int], runs: Sequence[Run]) -> dict[int, Run]:
    """The run each pid belongs to: the run whose launcher process (the session leader) is the pid or an ancestor.

    Pids NVML reports from inside another pid namespace (a container) match nothing here, and are shown as anyone's.
    """
    by_pid = {run.pid: run for run in runs if run.pid is not None}
    if not pids or not by_pid:
        return {}
    try:
        import psutil
    except ImportError:
        return {pid: by_pid[pid] for pid in pids if pid in by_pid}
    owners: dict[int, Run] = {}
    for pid in pids:
        try:
            lineage = [pid, *(parent.pid for parent in psutil.Process(pid).parents())]
        except psutil.Error:
            lineage = [pid]
        run = next((by_pid[p] for p in lineage if p in by_pid), None)
        if run is not None:
            owners[pid] = run
    return owners
