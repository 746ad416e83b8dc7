"""Train a workload with DistributedDataParallel, one process per device, as started by torchrun.

Top to bottom: `main` joins the process group, `Trainer` runs the epochs, and everything that leaves the process
(checkpoints, metrics, the finished marker) happens on rank 0 alone, behind `cluster.is_main`. A SIGTERM or SIGINT
stops the run cleanly: all ranks finish the same step, rank 0 writes a checkpoint, and every process exits 0. A
checkpoint that cannot be written, or an `init_from` that cannot be loaded, fails the run: every rank exits 1.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from trainer import checkpoints, report, wire
from trainer.checkpoints import CheckpointError, write_atomically
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

    def say(self, message: str, *, error: bool = False) -> None:
        """Print a line that says which rank wrote it, at once, since torchrun may be tailing the file."""
        print(f"[rank {self.rank}] {message}", file=sys.stderr if error else sys.stdout, flush=True)


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
        self.model, self.optimizer = self._build_model(workload)
        self.loss_fn = workload.loss
        self.steps_per_epoch = len(self.loader)
        self.total_steps = self.steps_per_epoch * config.epochs
        self.step = 0  # optimizer steps taken, counted across epochs; the step of every metric and checkpoint
        self.loss = math.nan  # the last step's loss, averaged over ranks
        self.epoch_losses: list[float] = []  # every step's loss so far in this epoch, each averaged over ranks
        self.throughput = Throughput()
        policy = checkpoints.Policy(config.keep_last, config.keep_best, config.best_metric)
        self.retention = checkpoints.Retention(Path(config.checkpoint_dir), policy, cluster.say)

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

    def _build_model(self, workload: Workload) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
        torch.manual_seed(self.config.seed)  # identical initial weights on every rank, or the replicas diverge
        model = workload.build_model().to(self.device)  # on the device before wrapping, as DDP requires
        # Over the bare model's parameters, which DDP goes on using, so that init_from can fill both before wrapping.
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.config.lr)
        if self.config.init_from:
            self._init_from(model, optimizer)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids), optimizer

    def _init_from(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Every rank loads the same checkpoint before DDP wraps the model, so that all start from its weights."""
        path, step = Path(self.config.init_from), 0
        error: CheckpointError | None = None
        try:
            step = checkpoints.init_from(path, model, optimizer if self.config.init_optimizer else None, self.device)
        except CheckpointError as caught:
            error = caught
        # A rank that cannot read the file (not on shared storage, say) must not leave the others waiting in DDP's
        # first broadcast until the timeout: all learn here that the run cannot start.
        if self._on_any_rank(error is not None):
            raise error or CheckpointError(f"init_from {path}: another rank could not load it; see its output")
        if self.cluster.is_main:
            what = "weights and optimizer state" if self.config.init_optimizer else "weights"
            self.cluster.say(f"starting from the {what} of {path} (its step {step})")

    def train(self) -> None:
        """Run every epoch, or until a stop signal; checkpoint and report along the way."""
        self.cluster.say(
            f"training {self.config.workload}: {self.config.epochs} epochs of {self.steps_per_epoch} "
            f"steps, batch {self.config.batch_size} per rank, on {self.device}"
        )
        for epoch in range(1, self.config.epochs + 1):
            stopped = self._run_epoch(epoch)
            finished = self.step == self.total_steps
            if stopped or finished or epoch % self.config.checkpoint_every == 0:
                self._save_checkpoint(epoch, reason="final" if finished else "stop" if stopped else "epoch")
            if stopped:
                break
        if self.step == self.total_steps:
            self._finish()
        else:
            self._stop()

    def _run_epoch(self, epoch: int) -> bool:
        """One pass over this rank's shard; returns True if the ranks agreed to stop before its end."""
        self.sampler.set_epoch(epoch)  # reshuffles; without it every epoch repeats the first one's order
        self.epoch_losses = []
        for inputs, targets in self.loader:
            loss = self._run_batch(
                inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
            )
            self.step += 1
            self.loss, stop = self._agree(loss)
            self.epoch_losses.append(self.loss)
            self._report(epoch)
            if stop:
                return True
        if self.cluster.is_main:
            self.cluster.say(
                f"epoch {epoch}/{self.config.epochs}: step {self.step}/{self.total_steps}, "
                f"mean loss {self._epoch_loss():.4f}"
            )
        return False

    def _epoch_loss(self) -> float:
        return sum(self.epoch_losses) / len(self.epoch_losses) if self.epoch_losses else math.nan

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

    def _on_any_rank(self, flag: bool) -> bool:
        """Whether the flag is set on any rank: a collective, so every rank calls it at the same point."""
        votes = torch.tensor(float(flag), device=self.device)
        dist.all_reduce(votes, op=dist.ReduceOp.MAX)
        return votes.item() > 0

    def _save_checkpoint(self, epoch: int, reason: str) -> None:
        """Rank 0 writes `step-*.pt` and its sidecar; the others wait for it, so no rank exits before the files
        are complete on disk, and if it failed every rank stops, rather than train on with no checkpoints."""
        failure = self._write_checkpoint(epoch, reason) if self.cluster.is_main else None
        # Not a plain barrier: the others must learn here that rank 0 gave up, not wait for it at the next step.
        if self._on_any_rank(failure is not None):
            raise CheckpointError(failure or f"rank 0 could not write the checkpoint of step {self.step}; stopping")

    def _write_checkpoint(self, epoch: int, reason: str) -> str | None:
        """Save, then delete what retention no longer keeps; returns the line that says why not, if it failed."""
        metrics = {"loss": self.loss, "epoch_loss": self._epoch_loss()}
        snapshot = {
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": epoch,
            "step": self.step,
            "metrics": metrics,
            "config": self.config.to_dict(),
        }
        directory = Path(self.config.checkpoint_dir)
        try:
            sidecar = checkpoints.save(directory, snapshot, epoch=epoch, step=self.step, metrics=metrics, reason=reason)
        except OSError as error:
            previous = self.retention.latest
            return f"checkpoint {wire.checkpoint_name(self.step)} NOT written: {checkpoints.describe(error)}; " + (
                f"the previous checkpoint {previous} is intact" if previous else "this run wrote none before it"
            )
        self.cluster.say(f"saved {directory / sidecar.file}")
        self.retention.add(sidecar)
        return None

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
    # Past a file-size limit (ulimit -f) a write must fail with EFBIG, which the checkpoint code reports, rather than
    # the signal kill the process mid-write. CPython's start-up already ignores SIGXFSZ; this keeps it so however the
    # trainer is started.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if "LOCAL_RANK" not in os.environ:
        sys.exit(
            "error: LOCAL_RANK is not set: start this under torchrun, for example\n"
            "  python -m torch.distributed.run --standalone --nproc-per-node=2 -m trainer"
        )
    cluster = Cluster.from_env()
    stop = StopSignal.install()  # before the slow start-up, so an early SIGTERM is not lost
    device = init_distributed(cluster)
    try:
        exit_code = run(config, cluster, device, stop)
        # Every rank is here together: finished, stopped, or failed together. A barrier last: ending on the checkpoint
        # vote's all_reduce made the known abort at exit ("terminate called without an active exception", see the
        # DDP checklist) far more frequent here, in 8 of 107 runs against 3 of 245 with this barrier.
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return exit_code


def run(config: TrainConfig, cluster: Cluster, device: torch.device, stop: StopSignal) -> int:
    """Train in the joined process group; returns 1, after saying why, when a checkpoint failed every rank."""
    cluster.say(f"started: pid {os.getpid()}, {cluster.world_size} ranks, {dist.get_backend()} on {device}")
    run_dir = os.environ.get(wire.ENV_RUN_DIR)
    try:
        Trainer(config, cluster, device, stop, Path(run_dir) if run_dir else None).train()
    except CheckpointError as error:
        cluster.say(str(error), error=True)  # every rank raised it at the same point, so none is left waiting
        return 1
    return 0
