"""Model FLOPs utilization: the model FLOP/s a run achieves against what its GPUs could do at its precision.

Achieved = the run's model FLOPs per sample (logged once under `wire.MODEL_FLOPS_KEY` by the built-in workloads, or
by a script) x its samples/s; MFU = achieved / (the GPU's dense peak at the run's precision x processes). The
peaks are the vendors' datasheet figures for dense math (no sparsity); a GPU not in the table, or a CPU run, gets
the FLOP/s without an MFU.
"""

from __future__ import annotations

from rankboard import wire
from sqlalchemy.orm import Session

from app.core.models import Run
from app.launcher.launchers import kind
from app.schemas.mfu import Mfu
from app.services import runs
from app.store import metrics as metric_store

TERA = 1e12
# Dense peak TFLOP/s by GPU model (matched against NVML's name, most specific first) and precision: bf16 and fp16
# on the tensor cores; fp32 (precision "off": PyTorch leaves TF32 off for matmuls by default) on the CUDA cores.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.2}),
    ("H100 NVL", {"bf16": 835.0, "fp16": 835.0, "fp32": 60.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.1, "fp16": 362.1, "fp32": 91.6}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
)
PRECISION_OF = {"bf16": "bf16", "fp16": "fp16", "off": "fp32"}


def peak_tflops(gpu: str, precision: str) -> float | None:
    """The dense peak of this GPU model at this precision, or None if the table does not know it."""
    for model, peaks in PEAK_TFLOPS:
        if model.lower() in gpu.lower():
            return peaks.get(precision)
    return None


def compute(*, flops_per_sample: float, samples_per_s: float, gpu: str | None, precision: str,
            processes: int) -> Mfu:  # fmt: skip
    """MFU from its parts; pure, so that it can be checked by hand."""
    achieved = flops_per_sample * samples_per_s / TERA
    peak = peak_tflops(gpu, precision) if gpu else None
    mfu = achieved / (peak * processes) if peak and processes else None
    return Mfu(flops_per_sample=flops_per_sample, achieved_tflops=achieved, gpu=gpu, precision=precision,
               peak_tflops=peak, processes=processes, mfu=mfu)  # fmt: skip


def run_mfu(db: Session, *, run: Run) -> Mfu | None:
    """The run's MFU at its last reported samples/s; None if it reported no model FLOPs."""
    flops = metric_store.last_value(db, run_id=run.id, key=wire.MODEL_FLOPS_KEY)
    if not flops or not run.samples_per_s:
        return None
    names = [str(gpu["name"]) for node in run.gpus or [] for gpu in node.get("gpus", [])]  # type: ignore[attr-defined]
    processes = kind(run.launcher).ranks(run)
    return compute(flops_per_sample=flops, samples_per_s=run.samples_per_s, gpu=names[0] if names else None,
                   precision=PRECISION_OF.get(run.precision, "fp32"), processes=processes)  # fmt: skip


def mfu_of(db: Session, *, run_id: int) -> Mfu | None:
    """`run_mfu` of the run with this id; raises RunNotFound."""
    return run_mfu(db, run=runs.get_run(db, run_id=run_id))
