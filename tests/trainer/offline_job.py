"""A user's training script for the offline tests (tests/trainer/test_offline.py, tests/e2e/test_offline_sync.py):
a small DDP model under torchrun with gloo (or one plain process), reporting with `report.init()` and nothing else.

Every rank logs `loss` (its own) and `rank/grad_norm` (its own, under its rank), rank 0 also the all-reduced
`train/loss`; rank 0 saves a checkpoint every CHECKPOINT_EVERY steps into the folder given, and says finished at
the end. Each rank writes what it logged, exactly, as JSON beside its output (`--logged DIR/rank<r>.json`), written
as it goes, so that a test compares the server's points with it. `--fail-at STEP` makes the last rank raise there.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from rankboard import report, wire
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT_EVERY = 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoints", type=Path)
    parser.add_argument("--logged", type=Path, required=True)
    parser.add_argument("--fail-at", type=int)
    args = parser.parse_args()
    distributed = "LOCAL_RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    report.init(config={"lr": 0.05, "steps": args.steps, "width": 8}, checkpoint_dir=args.checkpoints,
                total_steps=args.steps)  # fmt: skip
    torch.manual_seed(0)  # the same initial weights on every rank
    model: nn.Module = nn.Linear(8, 1)
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    logged: dict[str, list[list[float]]] = {}
    for step in range(1, args.steps + 1):
        if args.fail_at == step and rank == world - 1:
            raise RuntimeError(f"rank {rank} gave up at step {step}")
        x = torch.randn(16, 8, generator=generator)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        norm = float(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).norm())
        mine = {"loss": loss.item(), "rank/grad_norm": norm}
        if distributed:  # every rank takes part in the all-reduce; rank 0 reports the average
            average = loss.detach().clone()
            dist.all_reduce(average)
            if rank == 0:
                mine["train/loss"] = average.item() / world
        report.log(mine, step=step)
        report.heartbeat(step)
        for key, value in mine.items():
            logged.setdefault(key, []).append([step, value])
        args.logged.mkdir(parents=True, exist_ok=True)
        (args.logged / f"rank{rank}.json").write_text(json.dumps(logged))
        if rank == 0 and args.checkpoints is not None and step % CHECKPOINT_EVERY == 0:
            args.checkpoints.mkdir(parents=True, exist_ok=True)
            torch.save(
                {"model": getattr(model, "module", model).state_dict(), "step": step},
                args.checkpoints / wire.checkpoint_name(step),
            )
    if rank == 0:
        report.finished()
    report.close()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
