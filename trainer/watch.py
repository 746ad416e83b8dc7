"""What the built-in trainer watches on every rank for "which rank, and why": the first non-finite loss or gradient
norm, found through the all-reduce every step already runs, and named by rank with one more collective, once."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from rankboard import report, wire


class NonFiniteWatch:
    """Finds the step where the loss, or the gradient norm, first became NaN or infinite, and the ranks it began on.

    The ranks' losses and norms are summed in the step's all-reduce (Trainer._agree): a NaN or infinity on any rank
    makes the sum non-finite on every rank, so all of them learn it at once, at no extra cost. Only then, once, they
    all-gather their own values to name the ranks."""

    def __init__(self, rank: int, say: Callable[[str], None]) -> None:
        self.rank, self.say = rank, say
        self.loss_step: int | None = None  # the step the loss first went non-finite
        self.norm_step: int | None = None
        self.loss_ranks: list[int] = []
        self.norm_word = ""

    def check(self, step: int, loss_sum: float, norm_sum: float, local: Callable[[], torch.Tensor]) -> bool:
        """Look at this step's summed loss and norm; `local` is this rank's [loss, norm]. True when this step is the
        first that has a non-finite value of either (every rank returns the same)."""
        new_loss = self.loss_step is None and not math.isfinite(loss_sum)
        new_norm = self.norm_step is None and not math.isfinite(norm_sum)
        if not (new_loss or new_norm):
            return False
        mine = local()
        gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)  # every rank is here: the sums told all of them alike
        values = [pair.tolist() for pair in gathered]
        if new_norm:
            self.norm_step, self.norm_word = step, wire.number_word(values[0][1])
            if self.rank == 0:
                report.log({wire.NONFINITE_GRAD_NORM_KEY: values[0][1]}, step=step, rank=0)
        if new_loss:
            self.loss_step = step
            self.loss_ranks = [rank for rank, (loss, _norm) in enumerate(values) if not math.isfinite(loss)]
            if self.rank == 0:
                for rank in self.loss_ranks:
                    report.log({wire.NONFINITE_LOSS_KEY: values[rank][0]}, step=step, rank=rank)
        if self.rank == 0:
            self.say(self.sentence(values))
        return True

    def sentence(self, values: list[list[float]]) -> str:
        """What rank 0's log says: the same words as the run page."""
        if self.loss_step is None:
            return f"gradient norm became {self.norm_word} at step {self.norm_step:,} (the loss still finite)"
        loss = wire.number_word(values[self.loss_ranks[0]][0]) if self.loss_ranks else "non-finite"
        return wire.nonfinite_sentence(self.loss_step, self.loss_ranks, loss, self.norm_step, self.norm_word)


class ReplicaFingerprint:
    """Every `every` steps, a float64 sum of a fixed sample of the parameters, all-gathered and compared: DDP keeps
    the replicas bitwise equal only while every rank applies the same update, so any difference is a bug (a
    rank-dependent branch, a missed broadcast, a non-deterministic kernel). The first step a rank differs is
    reported (wire.DIVERGENCE_KEY), once."""

    SAMPLE = 64  # values of each parameter tensor, evenly spaced

    def __init__(self, model: torch.nn.Module, every: int, rank: int, say: Callable[[str], None]) -> None:
        self.every, self.rank, self.say = every, rank, say
        self.parameters = [p for p in model.parameters() if p.numel()]
        self.strides = [max(1, p.numel() // self.SAMPLE) for p in self.parameters]
        self.seen_at: int | None = None

    def check(self, step: int) -> None:
        """At a fingerprint step, compare the ranks' fingerprints; a collective, so every rank calls it alike."""
        if not self.every or step % self.every or self.seen_at is not None:
            return
        with torch.no_grad():
            mine = sum(
                (p.detach().reshape(-1)[::stride][: self.SAMPLE].double().sum() for p, stride in
                 zip(self.parameters, self.strides, strict=True)),
                torch.zeros((), dtype=torch.float64, device=self.parameters[0].device),
            ).reshape(1)  # fmt: skip
        gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
        prints = [float(value.item()) for value in gathered]
        odd = diverged(prints)
        if not odd:
            return
        self.seen_at = step
        if self.rank == 0:
            reference = prints[next(r for r in range(len(prints)) if r not in odd)]
            for rank in odd:
                report.log({wire.DIVERGENCE_KEY: prints[rank] - reference}, step=step, rank=rank)
            self.say(wire.divergence_sentence(step, odd))


def diverged(prints: list[float]) -> list[int]:
    """The ranks whose fingerprint is not the most common one (ties: rank 0's group is the reference)."""
    groups: dict[float, list[int]] = {}
    for rank, value in enumerate(prints):
        groups.setdefault(value, []).append(rank)
    reference = max(groups.values(), key=lambda ranks: (len(ranks), 0 in ranks))
    return [rank for rank in range(len(prints)) if rank not in reference]
