"""This server's own host, now: each GPU, its load, and which run holds it; CPU and memory where NVML finds none.

It reads NVML through `trainer.gpu`, the interface the trainer's sampler uses, so the fake NVML that CI runs on
serves both. NVML is opened once per app and read under a lock: the routes that call this are sync functions,
which FastAPI runs in its threadpool, so a slow NVML call never holds up the event loop, and two requests never
read NVML at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from app.models import Run, RunStatus
from app.schemas import GpuHolderOut, GpuProcessOut, HostGpuOut, HostOut
from app.store import runs as run_store
from trainer import gpu, wire

HOLDS_GPUS = (RunStatus.starting, RunStatus.running, RunStatus.stopping)


@dataclass(frozen=True)
class GpuNow:
    """One GPU as NVML read it just now."""

    gpu: wire.Gpu
    values: dict[str, float]
    errors: dict[str, str]
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)


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

    def read(self) -> HostNow:
        """Every GPU's values and processes; a GPU or a value that fails to read says why and the rest go on."""
        with self._lock:
            if not self._opened:
                self._open()
            nvml = self._nvml
            if nvml is None:
                return HostNow([], self._error, gpu.system_values())
            try:
                gpus = [_read_one(nvml, index) for index in range(nvml.nvmlDeviceGetCount())]
            except nvml.NVMLError as error:
                return HostNow([], f"NVML failed while listing GPUs: {error}", gpu.system_values())
            return HostNow(gpus, None, gpu.system_values())

    def _open(self) -> None:
        try:
            self._nvml = gpu.open_nvml(self._environ)
        except gpu.NvmlUnavailable as error:
            self._error = str(error)
        gpu.system_values()  # psutil's CPU percent is "since the last call": prime it, or the first read says 0
        self._opened = True

    def close(self) -> None:
        """Lets NVML go; the next read opens it again."""
        with self._lock:
            if self._nvml is not None:
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlShutdown()
            self._nvml, self._error, self._opened = None, None, False


def _read_one(nvml: gpu.Nvml, index: int) -> GpuNow:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    values, errors = gpu.read_gpu(nvml, handle)
    try:
        processes = gpu.gpu_processes(nvml, handle)
    except nvml.NVMLError as error:
        processes, errors["processes"] = [], str(error)
    return GpuNow(gpu.describe(nvml, index, handle), values, errors, processes)


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
        **{name: now.values.get(name) for name in wire.GPU_FIELDS if name != "run_mem"},
        processes=processes,
        held_by=sorted(holders.values(), key=lambda holder: holder.run_id),
        errors=now.errors,
    )


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
