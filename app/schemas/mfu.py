"""Model FLOPs utilization: the model FLOP/s a run achieves against its GPUs' peak (app/services/mfu.py)."""

from __future__ import annotations

from pydantic import BaseModel


class Mfu(BaseModel):
    """What a run's model FLOPs bought: FLOP/s achieved, and the utilization where the GPU's peak is known."""

    flops_per_sample: float
    achieved_tflops: float  # over all processes
    gpu: str | None  # the first GPU's name, as NVML gave it; None on a CPU run
    precision: str  # bf16, fp16 or fp32
    peak_tflops: float | None  # per GPU, from app.services.mfu.PEAK_TFLOPS
    processes: int
    mfu: float | None  # 0..1
