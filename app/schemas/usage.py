"""What runs cost: a run's GPU-hours (or CPU-hours), energy and money, with the goodput ledger's lost parts in the same
units (app/services/cost.py); and the usage of a set of runs by user, tag or launcher and by week
(app/services/usage.py)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Literal

from pydantic import BaseModel, Field

Device = Literal["gpu", "cpu"]
EnergyMethod = Literal["counter", "integral of power", "counter and integral of power", "none"]
GroupBy = Literal["user", "tag", "launcher"]


class Attempt(BaseModel):
    """One launch of the run to the end of its processes (a resume or a requeue starts another)."""

    launched_at: datetime
    ended_at: datetime  # now while it is live
    live: bool
    hours: float  # wall hours
    device_hours: float  # GPU-hours (GPUs held x wall), or CPU-hours (processes x wall) on a CPU run
    kwh: float | None  # None where no GPU energy was sampled


class CostPart(BaseModel):
    """One part of the goodput ledger within the time the run held its devices, in every unit."""

    name: str  # as the goodput ledger names it: training, startup, restarts, repeated, stalls, checkpoint...
    label: str
    device_hours: float
    share: float  # of the held device-hours, 0..1
    kwh: float | None  # its share of the energy
    cost: float | None  # its share of the money
    lost: bool  # badput: it bought no new training (training is not; neither is time not yet told apart)


class RunCost(BaseModel):
    """What one run held and what it cost, from its launches to their ends."""

    run_id: int
    device: Device = Field(description="gpu: it held GPUs, counted in GPU-hours; cpu: it ran on CPU processes, "
                           "counted in CPU-hours (processes x wall time).")  # fmt: skip
    unit: Literal["GPU-hours", "CPU-hours"]
    devices: int  # GPUs held, or processes on a CPU run
    held_from: str  # how the devices were counted, as a person reads it
    gpu_models: list[str]  # as NVML names them; empty on a CPU run or before the inventory came
    device_hours: float
    energy_kwh: float | None
    energy_method: EnergyMethod = Field(
        description="counter: NVML's total-energy counter (last - first per GPU and "
        "launch); integral of power: the sampled power over time; none: no sample."
    )
    price_per_hour: float | None  # dollars per GPU-hour, averaged over its GPUs at the admin's prices
    cost: float | None
    cost_note: str  # why there is no cost, or the price it came from
    queued_hours: float  # wall hours it waited to be launched: it held nothing then, so it costs nothing
    attempts: list[Attempt]
    parts: list[CostPart]
    goodput: float | None  # training over the held device-hours, 0..1; None where not itemized
    itemized: bool
    lost_device_hours: float  # badput
    lost_kwh: float | None
    lost_cost: float | None
    sentences: list[str]  # what the page says of it: the restarts' cost, the badput


class UsageRow(BaseModel):
    """A group's use within the period: its attempts' overlap with it, pro-rated."""

    group: str
    runs: int
    gpu_hours: float
    cpu_hours: float
    kwh: float | None
    cost: float | None  # None where no run of it had a price; else the priced runs' sum
    unpriced_gpu_hours: float  # GPU-hours of GPUs with no price set
    goodput: float | None  # training over the GPU- and CPU-hours of its itemized runs


class UsageWeek(BaseModel):
    """A group's use in one ISO week (Monday to Sunday, UTC) of the period."""

    week: str  # 2026-W48
    starts: date
    group: str
    gpu_hours: float
    cpu_hours: float
    kwh: float | None
    cost: float | None


class Usage(BaseModel):
    """GPU-hours, CPU-hours, energy, cost, goodput and runs per group, over a period, and the same per week."""

    by: GroupBy
    start: datetime | None  # the period's start (inclusive); None: since the first run
    end: datetime  # its end (exclusive)
    rows: list[UsageRow]  # most GPU-hours first; by tag, a run with several tags counts in each
    total: UsageRow  # each run once
    weeks: list[UsageWeek]
