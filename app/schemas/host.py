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


class GpuHealthOut(BaseModel):
    """What the GPU says of its own health, in words."""

    throttle_reasons: list[str] = Field(description="Why its clocks are held down now (power cap, thermal, ...).")
    xid: int | None = Field(description="Its newest Xid error since this server began watching it; null for none.")
    xid_meaning: str | None = Field(description="NVIDIA's meaning of that Xid.")
    not_supported: list[str] = Field(
        description="The health readings this GPU does not have (ECC, row remapping, ...)."
    )


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
    ecc_sbe_volatile: float | None = Field(None, description="Single-bit (corrected) ECC errors since driver load.")
    ecc_dbe_volatile: float | None = Field(None, description="Double-bit (uncorrected) ECC errors since driver load.")
    ecc_sbe_aggregate: float | None = Field(None, description="Single-bit ECC errors over the GPU's life.")
    ecc_dbe_aggregate: float | None = Field(None, description="Double-bit ECC errors over the GPU's life.")
    remap_corrected: float | None = Field(None, description="Rows remapped for correctable errors.")
    remap_uncorrected: float | None = Field(None, description="Rows remapped for uncorrectable errors.")
    remap_pending: float | None = Field(None, description="1 while a remap waits for the GPU's reset.")
    remap_failure: float | None = Field(None, description="1 once a remap failed.")
    retired_pending: float | None = Field(None, description="1 while a page retirement waits (pre-Ampere GPUs).")
    throttle: float | None = Field(None, description="NVML's clock-event reasons bitmask.")
    pcie_replay: float | None = Field(None, description="PCIe replays.")
    nvlink_replay: float | None = Field(None, description="NVLink replay errors, over all links.")
    nvlink_recovery: float | None = Field(None, description="NVLink recovery errors, over all links.")
    nvlink_crc_flit: float | None = Field(None, description="NVLink flit CRC errors, over all links.")
    nvlink_crc_data: float | None = Field(None, description="NVLink data CRC errors, over all links.")
    nvlink_ecc_data: float | None = Field(None, description="NVLink data ECC errors, over all links.")
    energy: float | None = Field(None, description="Joules since the driver loaded.")
    sm_active: float | None = Field(None, description="GPM: percent of SMs busy since the previous read.")
    sm_occupancy: float | None = Field(None, description="GPM: percent of warps resident against the maximum.")
    tensor_active: float | None = Field(None, description="GPM: percent of time any tensor pipe was busy.")
    dram_bw: float | None = Field(None, description="GPM: percent of DRAM bandwidth used.")
    processes: list[GpuProcessOut]
    held_by: list[GpuHolderOut]
    errors: dict[str, str]
    health: GpuHealthOut


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
