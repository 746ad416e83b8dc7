"""Run under torchrun by tests/trainer/test_options.py: builds real Trainers in a real 2-rank gloo process group and
writes what each option did, as JSON, to the file named by PROBE_OUT (from rank 0).

Each check drives the trainer's own methods, so what is measured is the code a run executes.
"""

# No `from __future__ import annotations`: DDP checks the comm hook's annotations as objects, not strings.
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.comm import KEYS
from trainer.config import TrainConfig
from trainer.train import Cluster, StopSignal, Trainer, build_model, init_distributed


def make(tmp: Path, **options: Any) -> Trainer:
    config = TrainConfig(checkpoint_dir=str(tmp / "checkpoints"), resume=False, **options)
    return Trainer(config, Cluster.from_env(), torch.device("cpu"), StopSignal())


def gathered(value: Any) -> list[Any]:
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def ddp_options(tmp: Path) -> dict[str, Any]:
    trainer = make(
        tmp, workload="mlp", find_unused_parameters=True, bucket_cap_mb=1, gradient_as_bucket_view=True,
        optimizer="sgd", weight_decay=0.01,
    )  # fmt: skip
    # SyncBatchNorm cannot run (nor be wrapped by DDP) on a CPU: its conversion is what can be seen here.
    cnn = build_model(TrainConfig(workload="cnn", sync_batchnorm=True), torch.device("cpu"))
    modules = [type(m).__name__ for m in cnn.modules()]
    return {
        "batchnorm": modules.count("BatchNorm2d"),
        "syncbatchnorm": modules.count("SyncBatchNorm"),
        "optimizer": type(trainer.optimizer).__name__,
        "weight_decay": trainer.optimizer.param_groups[0]["weight_decay"],
        "find_unused_parameters": trainer.model.find_unused_parameters,
        "bucket_bytes_cap": trainer.model.bucket_bytes_cap,
        "gradient_as_bucket_view": trainer.model.gradient_as_bucket_view,
    }


def allreduces_per_step(tmp: Path, grad_accum: int, steps: int = 4) -> list[int]:
    """How many gradient all-reduces (one per bucket) each optimizer step made, as the trainer's own communication
    hook (trainer/comm.py) counts them."""
    trainer = make(tmp, workload="mlp", grad_accum=grad_accum, bucket_cap_mb=1)
    batches = iter(trainer.loader)
    per_step = []
    for _ in range(steps):
        trainer._optimizer_step([next(batches) for _ in range(grad_accum)])
        per_step.append(int(trainer.comm.take_ms()[KEYS.index("rank/buckets")]))
    return per_step


def comm_share(tmp: Path, batch_size: int, steps: int = 12) -> dict[str, Any]:
    """Every rank's communication timings per step, and the step time, over `steps` steps after a warm-up."""
    trainer = make(tmp, workload="mlp", batch_size=batch_size)
    batches = iter(trainer.loader)
    trainer._optimizer_step([next(batches)])
    trainer.comm.take_ms()
    started = time.perf_counter()
    for _ in range(steps):
        trainer._optimizer_step([next(batches)])
    step_ms = 1000 * (time.perf_counter() - started) / steps
    return {"ranks": gathered(dict(zip(KEYS, trainer.comm.take_ms(), strict=True))), "step_ms": step_ms,
            "enabled": trainer.comm.enabled}  # fmt: skip


def sample_order(tmp: Path) -> dict[str, Any]:
    trainer = make(tmp, workload="mlp", batch_size=64)
    epochs = {}
    for epoch in (1, 2):
        trainer.sampler.set_epoch(epoch)
        trainer.sampler.skip = 0
        full = list(trainer.sampler)
        trainer.sampler.skip = 640  # what a run resumed after 10 steps of this epoch skips
        epochs[epoch] = {"indices": full, "resumed_matches": list(trainer.sampler) == full[640:]}
    return {"ranks": gathered(epochs), "dataset": len(trainer.sampler.dataset), "steps": trainer.steps_per_epoch}


def validation(tmp: Path) -> dict[str, Any]:
    trainer = make(tmp, workload="mlp")
    local, mean = trainer.validate()
    return {"locals": gathered(local), "mean": mean}


def clipping_and_schedule(tmp: Path) -> dict[str, Any]:
    trainer = make(tmp, workload="mlp", grad_clip=0.05, warmup_steps=4, lr_schedule="cosine", lr=0.01, epochs=1)
    _loss, norm_before = trainer._optimizer_step([next(iter(trainer.loader))])
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    factors = [trainer._lr_factor(step) for step in (0, 1, 3, 4, trainer.total_steps // 2, trainer.total_steps)]
    return {
        "norm_before": norm_before.item(),
        "norm_after": torch.nn.utils.get_total_norm(grads).item(),
        "lr_factors": factors,
        "lr_after_one_step": trainer.optimizer.param_groups[0]["lr"],
    }


def main() -> None:
    tmp = Path(sys.argv[1])
    init_distributed(Cluster.from_env(), timeout_s=60)
    try:
        results = {
            "ddp_options": ddp_options(tmp),
            "allreduces_per_step": {k: allreduces_per_step(tmp, k) for k in (1, 4)},
            "comm_share": {k: comm_share(tmp, k) for k in (8, 2048)},
            "sample_order": sample_order(tmp),
            "validation": validation(tmp),
            "clipping_and_schedule": clipping_and_schedule(tmp),
        }
        if dist.get_rank() == 0:
            Path(os.environ["PROBE_OUT"]).write_text(json.dumps(results))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
