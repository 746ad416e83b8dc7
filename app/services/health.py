"""Is a running run still progressing? Stalled ranks, and the GPU signature of a hung NCCL collective.

A run whose processes are gone is the supervisor's business (lost, failed). This is the other way a run dies: every
process alive, nothing moving. Each rank sends its own heartbeat, and only when its step moved (rankboard/report.py),
so a rank that hangs, and every rank waiting for it in a collective, shows as a heartbeat going stale. While they
wait, their GPUs spin in NCCL's kernels at "100% utilization": the GPU samples tell that apart from an idle hang.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from statistics import fmean

from sqlalchemy.orm import Session

from app.core.errors import RunNotFound
from app.core.humanize import duration
from app.core.models import Run, RunRank, RunStatus, utcnow
from app.schemas.health import GpuSpinOut, HealthOut, HealthState, StalledRankOut
from app.services import dump_requests, findings, gpu_health
from app.services.lifecycle import transitions
from app.store import health as health_store
from app.store import ranks as rank_store
from app.store import runs as run_store

NOT_PROGRESSING = "not progressing"  # how the reasons of the two health events begin; also how they are found
PROGRESSING_AGAIN = "progressing again"

GPU_WINDOW_S = 30  # how far back GPU samples count: a few of the sampler's periods, so one sample does not decide
# The signature of ranks spinning in a hung collective: NCCL's kernels poll a flag in GPU memory, so NVML (which
# counts "a kernel was running") reads ~100% while almost no arithmetic happens and the GPU draws close to its idle
# power. Measured on an H100 (700 W limit, 2026-11-22): idle 73 W; a resident kernel polling a
# flag that is never written, 100% utilization at 123-147 W (18-21% of the limit, from one thread to every thread
# of every SM polling); back-to-back bf16 matmuls 99% at 699 W. An A100 idles at ~60-90 W of 400 W. Real work at
# >= 90% utilization draws well over half the limit. 40% of each GPU's own limit sits between the two with room on both
# sides, and a fraction (not watts) holds for any model of GPU and under an administrator's power cap. It is only
# asked once heartbeats stopped, so a small model that is busy and cool but progressing never trips it.
BUSY_UTIL_PERCENT = 90.0
SPIN_POWER_FRACTION = 0.4
SPIN_FIELDS = ("util", "power", "power_limit")
CLOCK_SKEW_S = 5


def _health(state: HealthState, message: str, stalled: list[StalledRankOut] | None = None,
            behind: list[int] | None = None, gpu: GpuSpinOut | None = None) -> HealthOut:  # fmt: skip
    return HealthOut(state=state, message=message, stalled=stalled or [], behind=behind or [], gpu=gpu)


def assess(db: Session, run: Run, *, now: datetime, stall_after: timedelta) -> HealthOut:
    """The health of a running run at `now`; "ok" for a run in any other state."""
    if run.status != RunStatus.running:
        return _health("ok", "")
    # Counted in SQL first: the supervisor asks twice a second, and a 1,024-rank job's rows are read only once one
    # of them is silent (a heartbeat from before this launch counts from the launch: `_last_sign`).
    ranks, silent = rank_store.silent_count(db, run_id=run.id, before=now - stall_after)
    if not ranks:
        return _run_level(run, now=now, stall_after=stall_after)
    if not silent or (run.started_at is not None and now - run.started_at <= stall_after):
        return _health("ok", "")
    rows = rank_store.rank_rows(db, run_id=run.id)
    stalled = [
        StalledRankOut(rank=row.rank, host=row.host, step=row.step, heartbeat_at=row.heartbeat_at,
                       silent_s=(now - row.heartbeat_at).total_seconds())
        for row in rows
        if now - _last_sign(row, run) > stall_after
    ]  # fmt: skip
    if not stalled:
        return _health("ok", "")
    top = max(row.step for row in rows)
    behind = [row.rank for row in rows if row.step < top]
    phrase = _stalled_phrase(stalled, every=len(stalled) == len(rows))
    message = f"Not progressing: {phrase}{_behind_phrase(behind, top)}."
    message += gpu_health.stall_sentence(db, run=run, stalled=stalled)  # a GPU that failed first is the likely cause
    spin = gpu_spin(db, run_id=run.id, now=now)
    if spin is None:
        return _health("not_progressing", message, stalled, behind)
    return _health("hung_collective", f"{message} {_spin_sentence(spin, stalled, behind)}", stalled, behind, spin)


def _last_sign(row: RunRank, run: Run) -> datetime:
    # A heartbeat from before this launch (a resumed run) says nothing about now: silence counts from the launch.
    return max(row.heartbeat_at, run.started_at) if run.started_at else row.heartbeat_at


def _run_level(run: Run, *, now: datetime, stall_after: timedelta) -> HealthOut:
    """For a trainer whose ranks send no heartbeats of their own (a script reporting only from rank 0). A script of
    the user's that never reported cannot be judged: its silence is how it runs (the built-in trainer reports)."""
    last = run.heartbeat_at or (None if run.script else run.started_at)
    if last is None or now - last <= stall_after:
        return _health("ok", "")
    return _health("not_progressing", f"Not progressing: no report from the trainer for {duration(now - last)} "
                                      f"(last at step {run.step}).")  # fmt: skip


def _stalled_phrase(stalled: list[StalledRankOut], *, every: bool) -> str:
    ranks = "; ".join(f"rank {s.rank} on {s.host} at step {s.step}, silent {duration(s.silent_s)}" for s in stalled)
    if every:
        return f"no rank has reported a new step ({ranks})"
    verb = "has" if len(stalled) == 1 else "have"
    return f"{ranks} {verb} reported no new step while the other ranks still move"


def _behind_phrase(behind: list[int], top: int) -> str:
    if not behind:
        return ""
    which = f"rank {behind[0]} is" if len(behind) == 1 else f"ranks {', '.join(map(str, behind))} are"
    return f"; {which} behind the others' step {top}"


def _spin_sentence(spin: GpuSpinOut, stalled: list[StalledRankOut], behind: list[int]) -> str:
    which = "" if spin.gpus == spin.of else f" ({spin.gpus} of {spin.of})"
    suspects = [s for s in stalled if s.rank in behind] or sorted(stalled, key=lambda s: s.heartbeat_at)[:1]
    first = ", ".join(f"rank {s.rank} at step {s.step}" for s in suspects)
    return (
        f"GPUs{which} busy at {spin.util:.0f}% but drawing only {spin.power:.0f} W of {spin.power_limit:.0f} W: "
        f"typical of ranks spinning in a hung NCCL collective; find the rank that stopped (its last step: {first}), "
        "check its log, NCCL_DEBUG=INFO."
    )


def gpu_spin(db: Session, *, run_id: int, now: datetime) -> GpuSpinOut | None:
    """The hung-collective signature in the run's GPU samples of the last GPU_WINDOW_S, or None."""
    start = int(now.timestamp()) - GPU_WINDOW_S
    # The samples' steps are the nodes' clocks: a node a little ahead of this server still counts.
    end = start + GPU_WINDOW_S + CLOCK_SKEW_S
    means = health_store.gpu_means(db, run_id=run_id, fields=SPIN_FIELDS, start_step=start, end_step=end)
    gpus: dict[str, dict[str, float]] = {}
    for key, mean in means.items():
        gpu, _, field = key.rpartition("/")  # gpu/<host>/<index>/<field>
        if mean is not None:
            gpus.setdefault(gpu, {})[field] = mean
    sampled = [fields for fields in gpus.values() if all(field in fields for field in SPIN_FIELDS)]
    spinning = [f for f in sampled if _spins(f)]
    if not spinning:
        return None
    return GpuSpinOut(
        gpus=len(spinning),
        of=len(sampled),
        util=fmean(f["util"] for f in spinning),
        power=fmean(f["power"] for f in spinning),
        power_limit=fmean(f["power_limit"] for f in spinning),
    )


def _spins(gpu: dict[str, float]) -> bool:
    return gpu["util"] >= BUSY_UTIL_PERCENT and 0 < gpu["power"] <= SPIN_POWER_FRACTION * gpu["power_limit"]


def record(db: Session, run: Run, *, now: datetime, stall_after: timedelta) -> None:
    """The supervisor's part, inside its transaction: one event when a running run stops progressing, one when it
    moves again; nothing on the ticks in between. The open episode is read from the events, so a restarted server
    neither repeats nor forgets it."""
    if run.status != RunStatus.running:
        return
    health = assess(db, run, now=now, stall_after=stall_after)
    last = health_store.last_event(
        db, run_id=run.id, prefixes=(NOT_PROGRESSING, PROGRESSING_AGAIN), since=run.started_at
    )
    stalled_before = last is not None and last.reason.startswith(NOT_PROGRESSING)
    if health.state != "ok" and not stalled_before:
        reason = health.message.removeprefix("Not progressing: ")
        transitions.move(db, run, run.status, f"{NOT_PROGRESSING}: {reason}")
        dump_requests.ask(run)  # once per episode: every rank's stacks, to name the one the others wait for
    elif health.state == "ok" and last is not None and stalled_before:
        transitions.move(db, run, run.status, f"{PROGRESSING_AGAIN}: the ranks' steps move again "
                                              f"(not progressing was reported {duration(now - last.at)} "
                                              "before)")  # fmt: skip


def not_progressing(db: Session, run: Run, *, stall_after_s: float) -> bool:
    """A running run whose ranks stopped moving: the runs list marks it (the run page's view has its whole health)."""
    return assess(db, run, now=utcnow(), stall_after=timedelta(seconds=stall_after_s)).state != "ok"


def run_health(db: Session, *, run_id: int, stall_after_s: float) -> HealthOut:
    """The health of the run with this id, now; raises RunNotFound."""
    run = run_store.get_run(db, run_id)
    if run is None:
        raise RunNotFound(run_id)
    health = assess(db, run, now=utcnow(), stall_after=timedelta(seconds=stall_after_s))
    if run.status != RunStatus.running:
        return health
    slow = [straggler for straggler in findings.stragglers(db, run=run) if straggler.ongoing]
    return health.model_copy(update={"stragglers": slow})
