"""Communication share: how much of each training step waits on DDP's gradient all-reduce, from the timings each
rank of the built-in trainer reports (trainer/comm.py), and a sentence that says so with the numbers it rests on.

The DDP checklist's rule: compute to communication 10:1 or better is healthy; above 30% of the step, communication
dominates, and a larger batch per process, gradient accumulation or fewer GPUs would help.
"""

from __future__ import annotations

from statistics import fmean

from sqlalchemy.orm import Session

from app.core.errors import RunNotFound
from app.schemas.comm import CommShare
from app.store import comm as comm_store
from app.store import runs as run_store

WINDOW_STEPS = 200  # the recent steps the figures average: ten of the trainer's reports
DOMINATES = 0.30
KEYS = ("rank/comm_ms", "rank/step_ms", "rank/allreduce_ms", "rank/backward_ms", "rank/optimizer_ms", "rank/buckets")


def dominates(share: CommShare) -> bool:
    """Whether communication takes DOMINATES or more of the step."""
    return share.share >= DOMINATES


def sentence(share: CommShare) -> str:
    """What the run page says of it, with the numbers."""
    numbers = (
        f"{share.comm_ms:.1f} ms exposed all-reduce of a {share.step_ms:.1f} ms step, mean of {share.ranks} "
        f"rank{'s' if share.ranks != 1 else ''} over the last {WINDOW_STEPS} steps; {share.allreduce_ms:.1f} ms "
        f"of all-reduce in {share.buckets:g} bucket{'s' if share.buckets != 1 else ''} per step, "
        f"{max(0.0, share.allreduce_ms - share.comm_ms):.1f} ms of it hidden behind backward "
        f"({share.backward_ms:.1f} ms), optimizer {share.optimizer_ms:.1f} ms"
    )
    if dominates(share):
        return (f"{share.share:.0%} of each step waits on all-reduce ({numbers}): a larger batch per process or "
                "gradient accumulation would help.")  # fmt: skip
    return f"{share.share:.0%} of each step waits on all-reduce ({numbers})."


def comm_share(db: Session, *, run_id: int) -> CommShare | None:
    """The run's recent communication share, or None before its trainer reported any (or for a user's script)."""
    means = comm_store.recent_means(db, run_id=run_id, keys=KEYS, steps=WINDOW_STEPS)
    ranks = sorted({rank for key, rank in means if key == "rank/comm_ms" and ("rank/step_ms", rank) in means})
    if not ranks:
        return None

    def mean(key: str) -> float:
        return fmean(means.get((key, rank), 0.0) for rank in ranks)

    step = mean("rank/step_ms")
    per_rank = {r: means[("rank/comm_ms", r)] / means[("rank/step_ms", r)] for r in ranks if means[("rank/step_ms", r)]}
    return CommShare(
        share=mean("rank/comm_ms") / step if step > 0 else 0.0, comm_ms=mean("rank/comm_ms"), step_ms=step,
        allreduce_ms=mean("rank/allreduce_ms"), backward_ms=mean("rank/backward_ms"),
        optimizer_ms=mean("rank/optimizer_ms"), buckets=mean("rank/buckets"), ranks=len(ranks), per_rank=per_rank,
    )  # fmt: skip


def comm_share_of(db: Session, *, run_id: int) -> CommShare | None:
    """`comm_share` of the run with this id; raises RunNotFound."""
    if run_store.get_run(db, run_id) is None:
        raise RunNotFound(run_id)
    return comm_share(db, run_id=run_id)
