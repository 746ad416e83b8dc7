"""Train a workload with DistributedDataParallel, one process per device, as started by torchrun.

Top to bottom: `main` joins the process group, `Trainer` runs the epochs, and everything that leaves the process
(checkpoints, metrics, the finished marker) happens on rank 0 alone, behind `cluster.is_main`. A SIGTERM or SIGINT
stops the run cleanly: all ranks finish the same step, rank 0 writes a checkpoint, and every process exits 0.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import IO

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from trainer import report, wire
from trainer.config import TrainConfig
from trainer.workloads import WORKLOADS, Workload

# A dead or hung peer then fails the run within a minute, instead of after the default 10 or 30 minutes.
PROCESS_GROUP_TIMEOUT = timedelta(seconds=60)


@dataclass(frozen=True)
class Cluster:
    """Where this process sits in the job, as torchrun's environment describes it."""

    rank: int
    local_rank: int
    world_size: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Cluster:
        """Read RANK, LOCAL_RANK and WORLD_SIZE; raises KeyError naming the first one missing."""
        return cls(
            rank=int(environ["RANK"]), local_rank=int(environ["LOCAL_RANK"]), world_size=int(environ["WORLD_SIZE"])
        )

    @property
    def is_main(self) -> bool:
        """Whether this process is the one that writes files and reports metrics."""
        return self.rank == 0

    def say(self, message: str) -> None:
        """Print a line that says which rank wrote it, at once, since torchrun may be tailing the file."""
        print(f"[rank {self.rank}] {message}", flush=True)


class StopSignal:
    """Remembers that SIGTERM or SIGINT arrived; the training loop acts on it between steps."""

    def __init__(self) -> None:
        self.requested = False

    @classmethod
    def install(cls) -> StopSignal:
        """Route SIGTERM and SIGINT to a new flag; call from the main thread."""
        stop = cls()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, stop._handle)
        return stop

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: the handler runs between any two bytecodes of the main thread, in the middle of whatever it
        # was doing, so it is no place to write files or talk to other ranks.
        self.requested = True


class Throughput:
    """Samples per second over the last few seconds, so that a slow start or a pause soon stops counting."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._marks: deque[tuple[float, int]] = deque()

    def update(self, samples_so_far: int) -> float:
        """Record the running total of samples and return the recent rate."""
        now = time.perf_counter()
        self._marks.append((now, samples_so_far))
        while len(self._marks) > 2 and now - self._marks[0][0] > self.window_s:
            self._marks.popleft()
        start, samples_then = self._marks[0]
        return (samples_so_far - samples_then) / (now - start) if now > start else 0.0


class Trainer:
    """Runs one training over the process group; the same code on every rank."""

    def __init__(
        self, config: TrainConfig, cluster: Cluster, device: torch.device, stop: StopSignal, run_dir: Path | None = None
    ) -> None:
        self.config, self.cluster, self.device, self.stop, self.run_dir = config, cluster, device, stop, run_dir
        workload = WORKLOADS[config.workload]
        self.sampler, self.loader = self._build_data(workload)
        self.model, self.loss_fn = self._build_model(workload), workload.loss
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr)
        self.steps_per_epoch = len(self.loader)
        self.total_steps = self.steps_per_epoch * config.epochs
        self.step = 0  # optimizer steps taken, counted across epochs; the step of every metric and checkpoint
        self.loss = math.nan  # the last step's loss, averaged over ranks
        self.throughput = Throughput()

    def _build_data(self, workload: Workload) -> tuple[DistributedSampler[int], DataLoader[tuple[Tensor, ...]]]:
        dataset = workload.build_dataset()  # the same on every rank; the sampler gives each rank its own shard
        sampler: DistributedSampler[int] = DistributedSampler(
            dataset,
            num_replicas=self.cluster.world_size,
            rank=self.cluster.rank,
            shuffle=True,
            seed=self.config.seed,
            drop_last=True,
        )
        # In-memory tensors: worker processes would only add start-up time and copies.
        loader = DataLoader(
            dataset,
            batch_size=self.config.batch_size,
            sampler=sampler,
            shuffle=False,
            drop_last=True,
            pin_memory=self.device.type == "cuda",
        )
        if len(loader) == 0:
            raise ValueError(
                f"batch_size {self.config.batch_size} is more than the {len(sampler)} samples each "
                f"of the {self.cluster.world_size} ranks gets"
            )
        return sampler, loader

    def _build_model(self, workload: Workload) -> DistributedDataParallel:
        torch.manual_seed(self.config.seed)  # identical initial weights on every rank, or the replicas diverge
        model = workload.build_model().to(self.device)  # on the device before wrapping, as DDP requires
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def train(self) -> None:
        """Run every epoch, or until a stop signal; checkpoint and report along the way."""
        self.cluster.say(
            f"training {self.config.workload}: {self.config.epochs} epochs of {self.steps_per_epoch} "
            f"steps, batch {self.config.batch_size} per rank, on {self.device}"
        )
        for epoch in range(1, self.config.epochs + 1):
            stopped = self._run_epoch(epoch)
            if stopped or epoch % self.config.checkpoint_every == 0 or epoch == self.config.epochs:
                self._save_checkpoint(epoch)
            if stopped:
                break
        if self.step == self.total_steps:
            self._finish()
        else:
            self._stop()

    def _run_epoch(self, epoch: int) -> bool:
        """One pass over this rank's shard; returns True if the ranks agreed to stop before its end."""
        self.sampler.set_epoch(epoch)  # reshuffles; without it every epoch repeats the first one's order
        losses = []
        for inputs, targets in self.loader:
            loss = self._run_batch(
                inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
            )
            self.step += 1
            self.loss, stop = self._agree(loss)
            losses.append(self.loss)
            self._report(epoch)
            if stop:
                return True
        if self.cluster.is_main:
            self.cluster.say(
                f"epoch {epoch}/{self.config.epochs}: step {self.step}/{self.total_steps}, "
                f"mean loss {sum(losses) / len(losses):.4f}"
            )
        return False

    def _run_batch(self, inputs: Tensor, targets: Tensor) -> Tensor:
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = self.loss_fn(self.model(inputs), targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients across ranks during this call
        self.optimizer.step()
        return loss.detach()

    def _agree(self, loss: Tensor) -> tuple[float, bool]:
        """Average the loss over the ranks and learn whether any of them was asked to stop: one all_reduce."""
        # Every rank must leave the loop at the same step, or the others would wait forever in the next collective.
        # Reading the result is a device-to-host sync, paid once per step for the per-step loss the dashboard plots.
        packed = torch.stack([loss.float(), torch.tensor(float(self.stop.requested), device=self.device)])
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        loss_sum, stop_votes = packed.tolist()
        return loss_sum / self.cluster.world_size, stop_votes > 0

    def _report(self, epoch: int) -> None:
        if not self.cluster.is_main:
            return
        report.log({"loss": self.loss, "lr": self.optimizer.param_groups[0]["lr"]}, step=self.step)
        samples_per_s = self.throughput.update(self.step * self.config.batch_size * self.cluster.world_size)
        report.progress(
            wire.Progress(
                epoch=epoch,
                epochs=self.config.epochs,
                step=self.step,
                total_steps=self.total_steps,
                samples_per_s=samples_per_s,
            )
        )

    def _save_checkpoint(self, epoch: int) -> None:
        """Rank 0 writes `step-*.pt`; the others wait, so no rank exits before the file is complete on disk."""
        if self.cluster.is_main:
            path = Path(self.config.checkpoint_dir) / f"step-{self.step:08d}.pt"
            snapshot = {
                "model": self.model.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "epoch": epoch,
                "step": self.step,
                "config": self.config.to_dict(),
            }
            write_atomically(path, lambda file: torch.save(snapshot, file))
            self.cluster.say(f"saved {path}")
        dist.barrier()

    def _finish(self) -> None:
        """Record that the training completed: a final progress for the server, a marker in the run folder."""
        self.cluster.say(f"finished after {self.step} steps, final loss {self.loss:.4f}")
        if not self.cluster.is_main:
            return
        report.progress(
            wire.Progress(
                epoch=self.config.epochs,
                epochs=self.config.epochs,
                step=self.step,
                total_steps=self.total_steps,
                finished=True,
            )
        )
        report.close()
        if self.run_dir is not None:
            marker = {"steps": self.step, "final_loss": wire.encode_value(self.loss), "finished_at": time.time()}
            write_atomically(self.run_dir / wire.FINISHED_MARKER, lambda file: file.write(json.dumps(marker).encode()))

    def _stop(self) -> None:
        # No finished marker: the dashboard reads its absence as "stopped before the end".
        self.cluster.say(f"stopped on request at step {self.step} of {self.total_steps}")
        if self.cluster.is_main:
            report.close()


def write_atomically(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write a file so that a reader sees the previous version or the complete new one, never a part of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # In the same folder, so that os.replace is a rename on one filesystem. Not tempfile.mkstemp: its mode 0600
    # would hide checkpoints from a server running as another user on the shared storage.
    temp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temp, "xb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())  # the data is on disk before the name points at it
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def init_distributed(cluster: Cluster) -> torch.device:
    """Join the process group that torchrun set up; returns this rank's device."""
    if torch.cuda.is_available():
        torch.cuda.set_device(cluster.local_rank)  # before any CUDA work, or every rank piles onto GPU 0
        device = torch.device("cuda", cluster.local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, init_method="env://", timeout=PROCESS_GROUP_TIMEOUT)
    return device


def main(argv: Sequence[str] | None = None) -> int:
    """The `python -m trainer` entry point; returns 0 when training finished or was stopped on request."""
    config = TrainConfig.from_argv(argv)
    if "LOCAL_RANK" not in os.environ:
        sys.exit(
            "error: LOCAL_RANK is not set: start this under torchrun, for example\n"
            "  python -m torch.distributed.run --standalone --nproc-per-node=2 -m trainer"
        )
    cluster = Cluster.from_env()
    stop = StopSignal.install()  # before the slow start-up, so an early SIGTERM is not lost
    device = init_distributed(cluster)
    try:
        cluster.say(f"started: pid {os.getpid()}, {cluster.world_size} ranks, {dist.get_backend()} on {device}")
        run_dir = os.environ.get(wire.ENV_RUN_DIR)
        Trainer(config, cluster, device, stop, Path(run_dir) if run_dir else None).train()
    finally:
        dist.destroy_process_group()
    return 0
