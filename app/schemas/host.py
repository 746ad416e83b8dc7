"""This server's host: its GPUs, who holds them, CPU and memory."""

from __future__ import annotations

from pydantic import (
    BaseModel,
    Field,
)

from app.core.models import RunStatus


class GpuHolderOut(BaseModel):
    """A run that holds a GPU: it was given the GPU (`devices`), or one of its processes uses it (NVML)."""

    run_id: int
    name: str
    status: RunStatus
    by_devices: bool = Field(description="The launcher gave the run this GPU.")
    memory: int = Field(description="Bytes of GPU memory its processes hold, as NVML lists them.")


class GpuProcessOut(BaseModel):
    pid: int
    memory: int
    run_id: int | None = Field(description="The run the process belongs to; null for anyone else's.")


class HostGpuOut(BaseModel):
    """One GPU of this server's host, now. A value NVML could not read is null, with the reason in `errors`."""

    index: int
    uuid: str
    name: str
    util: float | None = Field(description="Percent of the last sample period a kernel ran.")
    mem_used: float | None = Field(description="Bytes.")
    mem_total: float | None = Field(description="Bytes.")
    temp: float | None = Field(description="°C.")
    power: float | None = Field(description="Watts.")
    power_limit: float | None = Field(description="Watts.")
    sm_clock: float | None = Field(description="MHz.")
    processes: list[GpuProcessOut]
    held_by: list[GpuHolderOut]
    errors: dict[str, str]


class HostOut(BaseModel):
    """This server's host: its GPUs, or why NVML found none, and its CPU and memory."""

    host: str
    nvml_error: str | None = Field(description="Why there are no GPUs: NVML's own reason; null when NVML works.")
    gpus: list[HostGpuOut]
    cpu_percent: float | None = Field(
        description="Busy percent of all cores since the previous reading; null on the first look (nothing measured "
        "yet) and without psutil."
    )
    mem_used: float | None
    mem_total: float | None
