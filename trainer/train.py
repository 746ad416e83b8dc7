"""Train a workload with DistributedDataParallel, one process per device, as started by torchrun.

Top to bottom: `main` joins the process group, `Trainer` runs the epochs, and everything that leaves the process
(checkpoints, metrics, the finished marker) happens on rank 0 alone, behind `cluster.is_main`. A SIGTERM, SIGINT or
SIGUSR2 (Slurm's "time limit near", from `#SBATCH --signal=B:USR2@<s>`) stops the run cleanly: all ranks finish the
same step, rank 0 writes a checkpoint, and every process exits 0. A checkpoint that cannot be written, or an
`init_from` that cannot be loaded, fails the run: every rank exits 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import random
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from rankboard import gpu, report, wire
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trainer import checkpoints, comm, faults, preflight, watch
from trainer.checkpoints import CheckpointError, one_line, write_atomically
from trainer.comm import CommTimer
from trainer.config import TrainConfig
from trainer.goodput import LEDGER
from trainer.workloads import WORKLOADS


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
    """Remembers that SIGTERM, SIGINT or SIGUSR2 arrived; the training loop acts on it between steps."""

    def __init__(self) -> None:
        self.requested = False

    @classmethod
    def install(cls) -> StopSignal:
        """Route SIGTERM, SIGINT and SIGUSR2 to a new flag; call from the main thread.

        SIGUSR2 is Slurm's warning that the time limit is near (NCCL catches SIGUSR1, so not that one): the run
        checkpoints and exits exactly as on a stop, and may be requeued to go on from that checkpoint."""
        stop = cls()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            signal.signal(signum, stop._handle)
        return stop

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: the handler runs between any two bytecodes of the main thread, in the middle of whatever it
        # was doing, so it is no place to write files or talk to other ranks.
        self.requested = True


MIN_RATE_SPAN_S = 0.001  # a rate is measured over at least this much time


class Throughput:
    """Samples per second over the last few seconds, so that a slow start or a pause soon stops counting."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._marks: deque[tuple[float, int]] = deque()
        self.rate = 0.0  # the last one returned: a run's final report carries it

    def update(self, samples_so_far: int, now: float | None = None) -> float:
        """Record the running total of samples (at `now`, perf_counter() by default) and return the recent rate."""
        now = time.perf_counter() if now is None else now
        self._marks.append((now, samples_so_far))
        while len(self._marks) > 2 and now - self._marks[0][0] > self.window_s:
            self._marks.popleft()
        start, samples_then = self._marks[0]
        # Over a span a clock can hardly tell from 0 s (the first steps of a small model, a coarse clock) the rate is
        # noise, or infinite: keep the last one until the span is long enough to measure.
        if now - start >= MIN_RATE_SPAN_S:
            self.rate = (samples_so_far - samples_then) / (now - start)
        return self.rate


class ResumableSampler(DistributedSampler[int]):
    """DistributedSampler that can start an epoch part-way: a resumed run skips the batches it already took."""

    def __init__(self, dataset: Dataset[Any], cluster: Cluster, seed: int) -> None:
        super().__init__(dataset, cluster.world_size, cluster.rank, shuffle=True, seed=seed, drop_last=True)
        self.skip = 0  # samples of this rank's shard to leave out at the start of the current epoch

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return self.num_samples - self.skip


class RankTimes:
    """This rank's time per step, split into waiting for data and computing, averaged since the last report."""

    def __init__(self) -> None:
        self.data_s, self.compute_s, self.steps = 0.0, 0.0, 0

    def add(self, data_s: float, compute_s: float) -> None:
        self.data_s, self.compute_s, self.steps = self.data_s + data_s, self.compute_s + compute_s, self.steps + 1

    def take_ms(self) -> list[float]:
        """[step, data, compute] milliseconds per step, and start counting afresh."""
        steps = max(self.steps, 1)
        data, compute = 1000 * self.data_s / steps, 1000 * self.compute_s / steps
        self.data_s, self.compute_s, self.steps = 0.0, 0.0, 0
        return [data + compute, data, compute]


# How often each rank's step times are gathered to rank 0: a collective, so not on every step.
RANK_TIMES_EVERY = wire.RANK_TIMES_EVERY
RANK_TIME_KEYS = wire.RANK_TIME_KEYS


class Trainer:
    """Runs one training over the process group; the same code on every rank.

    Position: `step` counts optimizer steps across epochs; `epoch` is the epoch in progress and `epoch_step` the
    optimizer steps already taken in it. A snapshot holds these with the model, optimizer, scheduler, scaler and every
    rank's RNG states, so a run restarted from it takes exactly the steps the uninterrupted run would have taken.
    """

    def __init__(
        self, config: TrainConfig, cluster: Cluster, device: torch.device, stop: StopSignal, run_dir: Path | None = None
    ) -> None:
        self.config, self.cluster, self.device, self.stop, self.run_dir = config, cluster, device, stop, run_dir
        self.workload = WORKLOADS[config.workload]
        train_set, val_set = self.workload.build_data()  # the same on every rank; samplers give each its shard
        self.sampler = ResumableSampler(train_set, cluster, config.seed)
        self.loader = self._loader(train_set, self.sampler)
        self.val_loader = self._loader(
            val_set, DistributedSampler(val_set, cluster.world_size, cluster.rank, shuffle=False, drop_last=True)
        )
        self.steps_per_epoch = len(self.sampler) // (config.batch_size * config.grad_accum)
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"batch_size {config.batch_size} x grad_accum {config.grad_accum} is more than the "
                f"{len(self.sampler)} samples each of the {cluster.world_size} ranks gets"
            )
        self.total_steps = self.steps_per_epoch * config.epochs
        self.step, self.epoch, self.epoch_step = 0, 1, 0
        self.loss = self.grad_norm = math.nan  # the last step's, averaged over ranks
        self.epoch_losses: list[float] = []  # every step's loss so far in this epoch, each averaged over ranks
        self.throughput = Throughput()
        self.times = RankTimes()
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.precision)
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
        policy = checkpoints.Policy(config.keep_last, config.keep_best, config.best_metric)
        self.retention = checkpoints.Retention(Path(config.checkpoint_dir), policy, cluster.say)
        self.model, self.optimizer, self.scheduler = self._build_model()
        self.fault = faults.Fault.from_env()  # None but in tests
        self.nonfinite = watch.NonFiniteWatch(cluster.rank, cluster.say)
        self.fingerprint = watch.ReplicaFingerprint(self.model, config.fingerprint_every, cluster.rank, cluster.say)
        self.skipped_update = False  # stop_on_nonfinite left the last step's non-finite gradients unapplied
        self.desync_group = self._desync_group()
        self.comm = CommTimer()  # times each bucket's all-reduce against backward and the optimizer
        self.comm.attach(self.model)

    def _desync_group(self) -> dist.ProcessGroup | None:
        """Where desync checks run their monitored barrier (gloo has it, NCCL not): the default group (None) on CPU,
        a gloo group beside NCCL's."""
        if not self.config.desync_checks or dist.get_backend() == "gloo":
            return None
        return dist.new_group(backend="gloo")

    def _loader(self, dataset: Dataset[Any], sampler: DistributedSampler[int]) -> DataLoader[tuple[Tensor, ...]]:
        # In-memory tensors: worker processes would only add start-up time and copies.
        return DataLoader(
            dataset, batch_size=self.config.batch_size, sampler=sampler, shuffle=False, drop_last=True,
            pin_memory=self.device.type == "cuda",
        )  # fmt: skip

    def _build_model(self) -> tuple[DistributedDataParallel, torch.optim.Optimizer, LambdaLR]:
        model = build_model(self.config, self.device)
        # Over the bare model's parameters, which DDP goes on using, so that a snapshot can fill both before wrapping.
        optimizer = self._optimizer(model)
        scheduler = LambdaLR(optimizer, self._lr_factor)
        snapshot = self._newest_snapshot() if self.config.resume else None
        if snapshot is not None:
            self._restore(snapshot, model, optimizer, scheduler)
        elif self.config.init_from:
            self._init_from(model, optimizer)
        ddp = DistributedDataParallel(
            model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            find_unused_parameters=self.config.find_unused_parameters,
            bucket_cap_mb=self.config.bucket_cap_mb,
            gradient_as_bucket_view=self.config.gradient_as_bucket_view,
        )
        return ddp, optimizer, scheduler

    def _optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        lr, decay = self.config.lr, self.config.weight_decay
        if self.config.optimizer == "sgd":
            return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=decay)
        kind = torch.optim.Adam if self.config.optimizer == "adam" else torch.optim.AdamW
        return kind(model.parameters(), lr=lr, weight_decay=decay)

    def _lr_factor(self, step: int) -> float:
        """The learning rate at a step, as a fraction of lr: linear warm-up, then constant or a cosine to 0."""
        warmup = self.config.warmup_steps
        if step < warmup:
            return (step + 1) / warmup
        if self.config.lr_schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, self.total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    def _newest_snapshot(self) -> Path | None:
        """The newest checkpoint in the run's folder; every rank must see the same one (shared storage)."""
        newest = checkpoints.newest(Path(self.config.checkpoint_dir))
        step = wire.checkpoint_step(newest.name) if newest else -1
        seen = torch.tensor([float(step or 0), -float(step or 0)], device=self.device)
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        if seen[0].item() != -seen[1].item():
            raise CheckpointError(
                f"the ranks see different newest checkpoints in {self.config.checkpoint_dir} (this one: "
                f"{newest.name if newest else 'none'}): is the folder on storage that every node shares?"
            )
        return newest

    def _restore(
        self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: LambdaLR
    ) -> None:
        """Continue from a snapshot of this run: every rank loads it before DDP wraps the model."""
        error: CheckpointError | None = None
        try:
            snapshot = checkpoints.load_snapshot(path, self.device, what="resume from")
            model.load_state_dict(snapshot["model"])
            optimizer.load_state_dict(snapshot["optimizer"])
            scheduler.load_state_dict(snapshot["scheduler"])
            self.scaler.load_state_dict(snapshot["scaler"])
            self.step, self.epoch, self.epoch_step = snapshot["step"], snapshot["epoch"], snapshot["epoch_step"]
            self.epoch_losses = list(snapshot["epoch_losses"])
            self.loss = snapshot["metrics"]["loss"]
            self.retention.written = checkpoints.written_by_run(Path(self.config.checkpoint_dir))
            if snapshot["world_size"] != self.cluster.world_size:
                raise CheckpointError(
                    f"resume from {path}: written by {snapshot['world_size']} ranks, and this run has "
                    f"{self.cluster.world_size}; start a new run from it (init_from) instead"
                )
            _set_rng_state(snapshot["rng"][self.cluster.rank])
        except CheckpointError as caught:
            error = caught
        except (KeyError, TypeError, ValueError, RuntimeError) as caught:
            error = CheckpointError(f"resume from {path}: not a snapshot this trainer wrote ({one_line(caught)})")
        if self._on_any_rank(error is not None):
            raise error or CheckpointError(f"resume from {path}: another rank could not load it; see its output")
        if self.epoch_step == self.steps_per_epoch:  # saved at the end of an epoch: the next one begins
            self.epoch, self.epoch_step, self.epoch_losses = self.epoch + 1, 0, []
        self.cluster.say(f"resumed from {path} at step {self.step} (epoch {self.epoch}, step {self.epoch_step} in it)")

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
        """Run every epoch, or until a stop signal; validate, checkpoint and report along the way."""
        config = self.config
        self.cluster.say(
            f"training {config.workload}: {config.epochs} epochs of {self.steps_per_epoch} steps, batch "
            f"{config.batch_size} x {config.grad_accum} per rank, {config.optimizer}, precision {config.precision}, "
            f"on {self.device}"
        )
        sampler = gpu.start_sampling(report.default_reporter())  # this node's GPUs, from its local rank 0 only
        self.started, self.first_step = time.perf_counter(), self.step  # for the rate the last line reports
        LEDGER.first_step = LEDGER.step = self.step
        while self.epoch <= config.epochs:
            stopped = self._run_epoch()
            finished = self.step == self.total_steps
            by_epoch = config.checkpoint_unit == "epoch" and self.epoch % config.checkpoint_every == 0
            if stopped or finished or (by_epoch and self.epoch_step == self.steps_per_epoch):
                self._save_checkpoint(reason="final" if finished else "stop" if stopped else "epoch")
            if stopped:
                break
            self.epoch, self.epoch_step, self.epoch_losses = self.epoch + 1, 0, []
        if sampler is not None:
            sampler.stop()
        LEDGER.report()  # the final totals: what follows (exit) the server counts as stopping
        if self.step == self.total_steps:
            self._finish()
        else:
            self._stop()

    def _run_epoch(self) -> bool:
        """The rest of this epoch over this rank's shard; returns True if the ranks agreed to stop before its end."""
        self.sampler.set_epoch(self.epoch)  # reshuffles; without it every epoch repeats the first one's order
        self.sampler.skip = self.epoch_step * self.config.batch_size * self.config.grad_accum
        batches = iter(self.loader)
        while self.epoch_step < self.steps_per_epoch:
            started = time.perf_counter()
            LEDGER.switch("data")
            micro_batches = [next(batches) for _ in range(self.config.grad_accum)]
            if self.fault:
                time.sleep(self.fault.data_delay_s(rank=self.cluster.rank, step=self.step + 1))  # a test's straggler
            LEDGER.switch("step")
            fetched = time.perf_counter()
            loss, grad_norm = self._optimizer_step(micro_batches)
            self.step, self.epoch_step = self.step + 1, self.epoch_step + 1
            if self.fault and self.fault.hits("hang", rank=self.cluster.rank, step=self.step):
                faults.hang_forever()  # a test's rank that never reaches the step's all_reduce
            if self.config.desync_checks:  # raises "Rank 1 failed to pass monitoredBarrier", naming it
                dist.monitored_barrier(self.desync_group, timeout=timedelta(seconds=self.config.pg_timeout_s))
            stop = self._agree(loss, grad_norm)  # waits for the step's work: the times below include it
            self.times.add(fetched - started, time.perf_counter() - fetched)
            report.heartbeat(self.step)  # every rank's own: the dashboard sees which one stopped moving
            if self.fault and self.fault.hits("perturb", rank=self.cluster.rank, step=self.step):
                with torch.no_grad():
                    next(self.model.parameters()).view(-1)[0] += 1e-3  # a test's replica that diverges
            self.fingerprint.check(self.step)
            LEDGER.stepped(self.step)
            self._report()
            if self.config.val_every and self.step % self.config.val_every == 0:
                self._validate()
            if self.step % RANK_TIMES_EVERY == 0:
                self._report_rank_times()
            by_step = self.config.checkpoint_unit == "step" and self.step % self.config.checkpoint_every == 0
            if by_step and not stop and self.step < self.total_steps:
                self._save_checkpoint(reason="step")
            if stop:
                return True
        if self.cluster.is_main:
            self.cluster.say(
                f"epoch {self.epoch}/{self.config.epochs}: step {self.step}/{self.total_steps}, "
                f"mean loss {self._epoch_loss():.4f}"
            )
        return False

    def _epoch_loss(self) -> float:
        return sum(self.epoch_losses) / len(self.epoch_losses) if self.epoch_losses else math.nan

    def _autocast(self) -> contextlib.AbstractContextManager[None]:
        enabled = self.autocast_dtype is not None
        return torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.bfloat16, enabled=enabled)

    def _optimizer_step(self, micro_batches: list[list[Tensor]]) -> tuple[Tensor, Tensor]:
        """Forward and backward over the micro-batches, then one optimizer step; returns the mean loss and the
        gradient norm before clipping. Only the last micro-batch all-reduces its gradients: the others run under
        no_sync(), which leaves their gradients to accumulate locally."""
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for index, (inputs, targets) in enumerate(micro_batches):
            last = index == len(micro_batches) - 1
            with contextlib.nullcontext() if last else self.model.no_sync():
                with self._autocast():
                    outputs = self.model(inputs.to(self.device, non_blocking=True))
                    loss = self.workload.loss(outputs, targets.to(self.device, non_blocking=True))
                if self.fault and self.fault.hits("nan", rank=self.cluster.rank, step=self.step + 1):
                    loss = loss * math.nan  # a test's rank whose loss goes NaN at this step
                with self.comm.backward():
                    self.scaler.scale(loss / len(micro_batches)).backward()
            total += loss.detach().float()
        with self.comm.optimizer():
            grad_norm = self._apply_gradients()
        return total / len(micro_batches), grad_norm

    def _apply_gradients(self) -> Tensor:
        """Unscale, clip (or measure) and apply the gradients; returns their norm before clipping."""
        self.scaler.unscale_(self.optimizer)  # the true gradients, for the norm and the clipping
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        if self.config.grad_clip:
            grad_norm = torch.nn.utils.clip_grad_norm_(parameters, self.config.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        # DDP averaged the gradients, so every rank sees the same norm and skips alike, with no collective. The
        # check is a device sync: paid only by runs that ask to stop there.
        self.skipped_update = self.config.stop_on_nonfinite and not bool(torch.isfinite(grad_norm))
        if not self.skipped_update:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
        return grad_norm

    def _agree(self, loss: Tensor, grad_norm: Tensor) -> bool:
        """Average the loss over the ranks and learn whether any of them was asked to stop: one all_reduce.

        Every rank must leave the loop at the same step, or the others would wait forever in the next collective.
        Reading the result is a device-to-host sync, paid once per step for the per-step loss the dashboard plots.
        """
        stop_vote = torch.tensor(float(self.stop.requested), device=self.device)
        packed = torch.stack([loss.float(), grad_norm.float(), stop_vote])
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        loss_sum, norm_sum, stop_votes = packed.tolist()
        # A NaN or infinity on any rank makes these sums non-finite on every rank: they all see it here, together.
        local = lambda: torch.stack([loss.float(), grad_norm.float()])  # noqa: E731 - made only when one is not finite
        if self.nonfinite.check(self.step, loss_sum, norm_sum, local) and self.config.stop_on_nonfinite:
            self._halt_nonfinite()
            return True
        self.loss, self.grad_norm = loss_sum / self.cluster.world_size, norm_sum / self.cluster.world_size
        self.epoch_losses.append(self.loss)
        return stop_votes > 0

    def _halt_nonfinite(self) -> None:
        """Stop at the first non-finite value: the checkpoint then written holds the last finite step's weights."""
        if self.skipped_update:  # its update was not applied: the position goes back to the step before
            self.step, self.epoch_step = self.step - 1, self.epoch_step - 1
        self.cluster.say(f"stopping at step {self.step}: a non-finite loss or gradient norm (stop_on_nonfinite)")

    def _report(self) -> None:
        if not self.cluster.is_main:
            return
        samples_per_s = self.throughput.update(
            self.step * self.config.batch_size * self.config.grad_accum * self.cluster.world_size
        )
        metrics = {
            "loss": self.loss,
            "lr": self.optimizer.param_groups[0]["lr"],
            "grad_norm": self.grad_norm,
            "samples_per_s": samples_per_s,
        }
        if self.workload.tokens_per_sample:
            metrics["tokens_per_s"] = samples_per_s * self.workload.tokens_per_sample
        if self.step == self.first_step + 1 and self.workload.flops_per_sample:  # once a launch: for MFU
            metrics[wire.MODEL_FLOPS_KEY] = self.workload.flops_per_sample
        report.log(metrics, step=self.step)
        report.progress(self._progress(samples_per_s))

    def _progress(self, samples_per_s: float = 0.0, *, finished: bool = False) -> wire.Progress:
        # After the last epoch `self.epoch` stands one past it, the loop's exit condition: no run has epoch 11 of 10.
        return wire.Progress(
            epoch=min(self.epoch, self.config.epochs), epochs=self.config.epochs, step=self.step,
            total_steps=self.total_steps,
            samples_per_s=samples_per_s, finished=finished, restart=_restart_count(),
        )  # fmt: skip

    def validate(self) -> tuple[list[float], list[float]]:
        """Loss and accuracy over this rank's shard of the validation set, and their means over all ranks."""
        model = self.model.module  # no DDP: evaluation needs no gradient sync, nor its buffer broadcast
        model.eval()
        losses, accuracies = [], []
        with torch.no_grad(), self._autocast():
            for inputs, targets in self.val_loader:
                outputs = model(inputs.to(self.device, non_blocking=True))
                targets = targets.to(self.device, non_blocking=True)
                losses.append(self.workload.loss(outputs, targets).float())
                accuracies.append(self.workload.accuracy(outputs, targets))
        model.train()
        local = torch.stack([torch.stack(losses).mean(), torch.stack(accuracies).mean()])
        mean = local.clone()
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)  # equal shards (drop_last), so the mean of means is the mean
        return local.tolist(), (mean / self.cluster.world_size).tolist()

    def _validate(self) -> None:
        with LEDGER.within("validation"):
            _local, (val_loss, val_accuracy) = self.validate()
        if self.cluster.is_main:
            report.log({"val_loss": val_loss, "val_accuracy": val_accuracy}, step=self.step)

    def _report_rank_times(self) -> None:
        """Gather every rank's step, data-wait and compute times to rank 0, which reports them under each rank."""
        keys = RANK_TIME_KEYS + (comm.KEYS if self.comm.enabled else ())
        comm_ms = self.comm.take_ms()
        mine = torch.tensor(self.times.take_ms() + (comm_ms if self.comm.enabled else []), device=self.device)
        gathered = [torch.zeros_like(mine) for _ in range(self.cluster.world_size)]
        dist.all_gather(gathered, mine)
        if self.cluster.is_main:
            for rank, times in enumerate(gathered):
                report.log(dict(zip(keys, times.tolist(), strict=True)), step=self.step, rank=rank)

    def _on_any_rank(self, flag: bool) -> bool:
        """Whether the flag is set on any rank: a collective, so every rank calls it at the same point."""
        votes = torch.tensor(float(flag), device=self.device)
        dist.all_reduce(votes, op=dist.ReduceOp.MAX)
        return votes.item() > 0

    def _save_checkpoint(self, reason: str) -> None:
        """Rank 0 writes `step-*.pt` and its sidecar; the others wait for it, so no rank exits before the files
        are complete on disk, and if it failed every rank stops, rather than train on with no checkpoints."""
        with LEDGER.within("checkpoint"):
            rng_states: list[Any] = [None] * self.cluster.world_size
            dist.all_gather_object(rng_states, _rng_state())  # each rank's own, for an exact continuation
            failure = self._write_checkpoint(reason, rng_states) if self.cluster.is_main else None
            # Not a plain barrier: the others must learn here that rank 0 gave up, not wait for it at the next step.
            failed = self._on_any_rank(failure is not None)
        if failed:
            raise CheckpointError(failure or f"rank 0 could not write the checkpoint of step {self.step}; stopping")

    def _write_checkpoint(self, reason: str, rng_states: list[Any]) -> str | None:
        """Save, then delete what retention no longer keeps; returns the line that says why not, if it failed."""
        metrics = {"loss": self.loss, "epoch_loss": self._epoch_loss()}
        snapshot = {
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch,
            "epoch_step": self.epoch_step,
            "epoch_losses": list(self.epoch_losses),
            "step": self.step,
            "world_size": self.cluster.world_size,
            "rng": rng_states,
            "metrics": metrics,
            "config": self.config.to_dict(),
        }
        directory = Path(self.config.checkpoint_dir)
        try:
            sidecar = checkpoints.save(
                directory, snapshot, epoch=self.epoch, step=self.step, metrics=metrics, reason=reason
            )
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
        seconds = time.perf_counter() - self.started
        rate = (self.step - self.first_step) / seconds if seconds > 0 else math.nan
        self.cluster.say(f"finished after {self.step} steps, final loss {self.loss:.4f}, {rate:.1f} steps/s")
        if not self.cluster.is_main:
            return
        report.progress(self._progress(self.throughput.rate, finished=True))
        report.close()
        if self.run_dir is not None:
            marker = {"steps": self.step, "final_loss": wire.encode_value(self.loss), "finished_at": time.time()}
            write_atomically(self.run_dir / wire.FINISHED_MARKER, lambda file: file.write(json.dumps(marker).encode()))

    def _stop(self) -> None:
        # No finished marker: the dashboard reads its absence as "stopped before the end".
        self.cluster.say(f"stopped on request at step {self.step} of {self.total_steps}")
        if self.cluster.is_main:
            report.close()


def build_model(config: TrainConfig, device: torch.device) -> torch.nn.Module:
    """The workload's model as DDP will wrap it: seeded alike on every rank, SyncBatchNorm if asked, on the device."""
    torch.manual_seed(config.seed)  # identical initial weights on every rank, or the replicas diverge
    model = WORKLOADS[config.workload].build_model()
    if config.sync_batchnorm:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # before .to() and DDP, as it must be
    return model.to(device)  # on the device before wrapping, as DDP requires


def _restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _rng_state() -> dict[str, Any]:
    """Every random generator this process draws from: torch's (CPU and its CUDA device) and Python's."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    return {"torch": torch.get_rng_state(), "cuda": cuda, "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())
    random.setstate(state["python"])


def init_distributed(cluster: Cluster, timeout_s: int) -> torch.device:
    """Join the process group that torchrun set up; returns this rank's device.

    The timeout makes a dead or hung peer fail the run in that many seconds, not after the default 10 or 30 minutes.
    """
    if torch.cuda.is_available():
        torch.cuda.set_device(cluster.local_rank)  # before any CUDA work, or every rank piles onto GPU 0
        device = torch.device("cuda", cluster.local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
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
    if not torch.cuda.is_available() and config.needs_cuda():
        sys.exit("error: " + "; ".join(config.needs_cuda()))
    cluster = Cluster.from_env()
    stop = StopSignal.install()  # before the slow start-up, so an early SIGTERM is not lost
    LEDGER.switch("startup_group")
    device = init_distributed(cluster, config.pg_timeout_s)
    try:
        exit_code = run(config, cluster, device, stop)
        # Every rank is here together: finished, stopped, or failed together. A barrier last: ending on the checkpoint
        # vote's all_reduce made the known abort at exit ("terminate called without an active exception", see the
        # DDP checklist) far more frequent here, in 8 of 107 runs against 3 of 245 with this barrier.
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return exit_code


def run_preflight(config: TrainConfig, cluster: Cluster, device: torch.device, run_dir: Path | None) -> bool:
    """Compare the ranks before the first step (trainer/preflight.py); False when the run must not go on."""
    with LEDGER.within("startup_preflight"):
        result = preflight.check(device, cluster.rank, cluster.world_size, os.environ)
    refused = config.preflight == "refuse" and not result.ok
    if cluster.is_main:
        for m in result.mismatches:
            cluster.say(f"preflight: rank {m.rank} has {m.field} {m.value}, the others {m.common}", error=True)
        for rank in result.slow_ranks:
            cluster.say(f"preflight: rank {rank}'s all-reduce runs at {result.bus_gbps[rank]:.2f} GB/s, far below "
                        f"the others", error=True)  # fmt: skip
        preflight.keep(dataclasses.replace(result, refused=refused), run_dir)
    if refused:
        cluster.say("preflight refused the run (preflight=refuse): the ranks differ; see rank 0's output", error=True)
    return not refused


def run(config: TrainConfig, cluster: Cluster, device: torch.device, stop: StopSignal) -> int:
    """Train in the joined process group; returns 1, after saying why, when a checkpoint failed every rank."""
    cluster.say(f"started: pid {os.getpid()}, {cluster.world_size} ranks, {dist.get_backend()} on {device}")
    run_dir = os.environ.get(wire.ENV_RUN_DIR)
    if config.preflight != "off" and not run_preflight(config, cluster, device, Path(run_dir) if run_dir else None):
        return 1
    LEDGER.switch("startup_build")
    try:
        Trainer(config, cluster, device, stop, Path(run_dir) if run_dir else None).train()
    except CheckpointError as error:
        cluster.say(str(error), error=True)  # every rank raised it at the same point, so none is left waiting
        return 1
    return 0
