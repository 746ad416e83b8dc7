"""A plain PyTorch DDP training script, written the way the DDP checklist says, that reports to Rankboard.

From the dashboard: a new run with "Your own script" set to this file (copied into the shared folder).
Launched elsewhere, reporting to a dashboard: RANKBOARD_URL=http://dash:8000 RANKBOARD_TOKEN=<an API token> \
    torchrun --standalone --nproc-per-node=2 examples/ddp_train.py --epochs 5    (or the same in your own sbatch)

Rankboard's lines are marked "Rankboard" below; with no dashboard to report to, they do nothing. Everything
else is ordinary DDP: one process per GPU (gloo on CPUs), DistributedSampler with set_epoch, rank-0 snapshots written
atomically and followed by a barrier, and a restart (torchrun --max-restarts, or a resumed run) that continues from
the newest snapshot.
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from rankboard import report  # Rankboard: the client
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def synthetic_regression(samples: int = 8192, features: int = 16) -> TensorDataset:
    """y = x·w + noise, the same on every rank."""
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(samples, features, generator=generator)
    weights = torch.randn(features, 1, generator=generator)
    return TensorDataset(inputs, inputs @ weights + 0.1 * torch.randn(samples, 1, generator=generator))


class Trainer:
    def __init__(self, args: argparse.Namespace, rank: int, local_rank: int, world_size: int) -> None:
        self.args, self.rank = args, rank
        self.device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        dataset = synthetic_regression()
        self.sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
        self.loader = DataLoader(dataset, batch_size=args.batch_size, sampler=self.sampler, drop_last=True)
        torch.manual_seed(0)  # the same initial weights on every rank
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(self.device)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        self.epoch, self.step = 0, 0
        self.snapshot = Path(args.snapshot)
        if self.snapshot.exists():
            self._load_snapshot(model)  # into the bare model, before DDP wraps it
        self.model = DistributedDataParallel(model, device_ids=[local_rank] if self.device.type == "cuda" else None)

    def _load_snapshot(self, model: nn.Module) -> None:
        state = torch.load(self.snapshot, map_location=self.device, weights_only=True)
        model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch, self.step = state["epoch"], state["step"]
        print(f"[rank {self.rank}] resuming from {self.snapshot} at epoch {self.epoch}", flush=True)

    def _save_snapshot(self) -> None:
        if self.rank == 0:
            state = {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "epoch": self.epoch, "step": self.step}  # fmt: skip
            temporary = self.snapshot.with_suffix(".tmp")
            torch.save(state, temporary)
            os.replace(temporary, self.snapshot)  # a crash mid-write never leaves half a snapshot
        dist.barrier()

    def train(self) -> None:
        while self.epoch < self.args.epochs:
            self.sampler.set_epoch(self.epoch)
            for inputs, targets in self.loader:
                inputs, targets = inputs.to(self.device), targets.to(self.device)
                loss = F.mse_loss(self.model(inputs), targets)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                self.step += 1
                report.heartbeat(self.step)  # Rankboard: every rank says where it is (a hung rank shows by name)
                # The loss summed over ranks (report the run's, not rank 0's alone), and whether any rank was asked
                # to stop: all stop at the same step, or the others would wait for it in the next all_reduce.
                summed = torch.stack([loss.detach(), torch.tensor(float(report.stop_requested()), device=self.device)])
                dist.all_reduce(summed)
                if self.rank == 0:
                    report.log({"loss": summed[0].item() / dist.get_world_size()}, step=self.step)  # Rankboard
                if summed[1].item() > 0:
                    print(f"[rank {self.rank}] stopping at step {self.step}, as the dashboard asked", flush=True)
                    self._save_snapshot()
                    return
            self.epoch += 1
            self._save_snapshot()
            if self.rank == 0:
                print(f"[rank 0] epoch {self.epoch}/{self.args.epochs} done at step {self.step}", flush=True)
        if self.rank == 0:
            report.finished()  # Rankboard: training completed, whatever torchrun's exit code says afterwards
        report.close()  # Rankboard: send what is queued before the process ends (it also runs at exit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    default_snapshot = Path(os.environ.get("RANKBOARD_CHECKPOINT_DIR", ".")) / "snapshot.pt"
    parser.add_argument("--snapshot", default=str(default_snapshot), help="where the newest snapshot is kept")
    args = parser.parse_args()
    rank, local_rank, world_size = (int(os.environ[name]) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # before any CUDA work
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=60))
    # Rankboard: launched elsewhere, every rank joins its job's one run; in a dashboard run this only samples GPUs.
    report.init(config=vars(args), takes_stop=True)  # named by RANKBOARD_RUN_NAME, else "ddp_train"
    try:
        Trainer(args, rank, local_rank, world_size).train()
        # All ranks leave together (rank 0 may still be sending its last metrics): ending unevenly makes gloo's rare
        # abort at exit, "terminate called without an active exception", far likelier (see trainer/train.py).
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
