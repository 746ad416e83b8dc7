"""What a run's GPUs said about their own health (rankboard.gpu samples it from NVML), as faults a person reads.

A fault is a GPU's Xid error, a double-bit (uncorrectable) ECC error counted during the run, a row remap pending or
failed, or a clock slowdown the hardware forced (HW slowdown, HW thermal, power brake). Each names its GPU, its node,
the second it was first seen and, through the run's node inventory, the rank that used the GPU. The run's health,
its "What went wrong" box, its stragglers and the `gpu_fault` alert all read them from here.

Only series whose summary shows trouble (a max above 0, or a counter that moved) have their points read, so a healthy
run costs one indexed query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from rankboard import wire
from sqlalchemy.orm import Session

from app.core.models import Run
from app.schemas.forensics import StragglerOut
from app.schemas.health import StalledRankOut
from app.schemas.logs import DiagnosisOut
from app.store import gpu_health as store
from app.store import ranks as rank_store

# field -> fault kind; the counters count as a fault when they rose during the run, the flags when set.
COUNTERS = {"ecc_dbe_volatile": "ecc"}
FLAGS = {"remap_pending": "remap", "remap_failure": "remap", "retired_pending": "remap"}
FIELDS = ("xid", "throttle", *COUNTERS, *FLAGS)
NEWEST = 3600  # points read of a suspect series: its last hour of samples ...
THROTTLE_NEWEST = 600  # ... of the clock reasons, a sample every second that only bits tell apart: its last 10 min
HW_SLOWDOWN_LOWEST = wire.HW_SLOWDOWN_BITS & -wire.HW_SLOWDOWN_BITS  # a bitmask below this has no HW bit set
ADVICE = {
    "xid": "Read NVIDIA's Xid catalogue for this number; run nvidia-smi -q on the node. Xids 48, 63, 64, 74, 79, 92, "
    "94, 95 and 119 point at the hardware: drain the node and tell its administrators, then resume the run from its "
    "newest snapshot on other GPUs.",
    "ecc": "The GPU's memory corrupted data it could not correct: resume from the newest snapshot on other GPUs, and "
    "have the node drained; the GPU needs a reset (row remapping) or service.",
    "remap": "The GPU must be reset for the remap to take effect (or needs service if it failed): drain the node, "
    "reset the GPU, and resume on other GPUs meanwhile.",
    "hw_slowdown": "The GPU slowed itself: check its cooling and power (nvidia-smi -q -d PERFORMANCE on the node); "
    "every rank waits for the slowest, so one slow GPU slows the whole run.",
}
SLOWDOWN_KIND = "gpu_hw_slowdown"  # the diagnosis kind of a GPU its hardware slowed
TITLES = {"xid": "GPU Xid error", "ecc": "Double-bit ECC error on a GPU", "remap": "GPU memory row remap",
          "hw_slowdown": "GPU slowed down by its hardware"}  # fmt: skip


@dataclass(frozen=True)
class GpuFault:
    """One GPU's fault: what, where, when it was first seen, and the rank that used that GPU (None: not known)."""

    kind: str  # xid, ecc, remap, hw_slowdown
    host: str
    index: int
    at: int  # unix second
    what: str  # "reported Xid 79 (GPU has fallen off the bus)"
    rank: int | None = None

    @property
    def gpu(self) -> str:
        return f"GPU {self.index} on {self.host}"

    @property
    def sentence(self) -> str:
        clock = datetime.fromtimestamp(self.at, UTC).strftime("%H:%M:%S")
        return f"{self.gpu} {self.what} at {clock}"


def faults(db: Session, *, run: Run, since: int | None = None) -> list[GpuFault]:
    """The run's GPU faults, oldest first; only those at or after `since` (a unix second) when given."""
    found = [f for s in store.suspect_series(db, run_ids=[run.id], fields=FIELDS, above=0) for f in _faults(db, s)]
    found = [fault for fault in found if since is None or fault.at >= since]
    if not found:
        return []  # the supervisor asks on every tick: a healthy run costs one query
    ranks = gpu_ranks(db, run=run)
    return sorted((_with_rank(fault, ranks) for fault in found), key=lambda fault: (fault.at, fault.host, fault.index))


def _faults(db: Session, series: store.HealthSeries) -> list[GpuFault]:
    _, host, index, field = series.key.split("/")
    if field == "throttle" and (series.high or 0) < HW_SLOWDOWN_LOWEST:  # no HW bit can be set: no point reads
        return []
    if field in COUNTERS and series.high == series.low:
        return []  # counted before the run (a volatile count since the driver loaded), not during it
    points = store.newest(db, series_id=series.series_id, limit=THROTTLE_NEWEST if field == "throttle" else NEWEST)
    if field == "xid":
        return [GpuFault("xid", host, int(index), step, _xid_words(int(v))) for step, v in points]
    if field == "throttle":
        return _slowdown(host, int(index), points)
    if field in COUNTERS:
        first = points[0][1] if points else 0.0
        rose = next(((step, v) for step, v in points if v > first), None)
        if rose is None:
            return []
        what = f"counted {rose[1] - first:.0f} double-bit (uncorrectable) ECC error{'s' if rose[1] - first > 1 else ''}"
        return [GpuFault(COUNTERS[field], host, int(index), rose[0], what)]
    set_at = next((step for step, v in points if v > 0), None)
    words = {"remap_pending": "has a memory row remap pending (the GPU needs a reset)",
             "remap_failure": "failed to remap a bad memory row (the GPU needs service)",
             "retired_pending": "has a memory page retirement pending (the GPU needs a reset)"}  # fmt: skip
    return [] if set_at is None else [GpuFault(FLAGS[field], host, int(index), set_at, words[field])]


def _xid_words(xid: int) -> str:
    return f"reported Xid {xid} ({wire.xid_meaning(xid)})"


def _slowdown(host: str, index: int, points: Sequence[tuple[int, float]]) -> list[GpuFault]:
    """One fault for the samples in which the hardware slowed the GPU: from the first, with how many there were."""
    slowed = [(step, int(v)) for step, v in points if int(v) & wire.HW_SLOWDOWN_BITS]
    if not slowed:
        return []
    why = sorted({words for step, bits in slowed for bit, (_, words) in wire.CLOCK_REASONS.items()
                  if bits & bit & wire.HW_SLOWDOWN_BITS})  # fmt: skip
    what = f"was slowed by its hardware ({', '.join(why)}) in {len(slowed)} samples from"
    return [GpuFault("hw_slowdown", host, index, slowed[0][0], what)]


def throttled(db: Session, *, run: Run, since: int) -> dict[tuple[str, int], set[str]]:
    """Why each GPU's clocks were held down in its samples since `since` (thermal, power cap, HW slowdown)."""
    found: dict[tuple[str, int], set[str]] = {}
    for series in store.suspect_series(db, run_ids=[run.id], fields=("throttle",), above=0):
        _, host, index, _ = series.key.split("/")
        bits = {int(v) for step, v in store.newest(db, series_id=series.series_id, limit=NEWEST) if step >= since}
        found[(host, int(index))] = {words for b in bits for bit, (words, _) in wire.CLOCK_REASONS.items() if b & bit}
    return found


def with_gpu_causes(db: Session, *, run: Run, stragglers: list[StragglerOut]) -> list[StragglerOut]:
    """Each straggler whose GPU was throttled while it lagged, with that named as the likely cause. A reason every
    GPU of the run shows (all at their power cap) sets none apart, so it is left out."""
    if not stragglers:
        return stragglers
    gpus = {rank: where for where, rank in gpu_ranks(db, run=run).items()}
    out = []
    for straggler in stragglers:
        where = gpus.get(straggler.rank)
        own = _own_reasons(db, run=run, where=where, since=int(straggler.since.timestamp())) if where else set()
        if where is not None and own:
            cause = f"; its GPU {where[1]} on {where[0]} was throttled ({', '.join(sorted(own))}): the likely cause"
            straggler = straggler.model_copy(update={"sentence": straggler.sentence + cause})
        out.append(straggler)
    return out


def _own_reasons(db: Session, *, run: Run, where: tuple[str, int], since: int) -> set[str]:
    """The throttle reasons of this GPU that not every other GPU of the run shared."""
    reasons = throttled(db, run=run, since=since)
    others = [why for gpu, why in reasons.items() if gpu != where]
    shared = set.intersection(*others) if others else set()
    return reasons.get(where, set()) - shared


def stall_sentence(db: Session, *, run: Run, stalled: Sequence[StalledRankOut]) -> str:
    """ " GPU 3 on node-7 reported Xid 79 (...) at 14:02:11, 3 s before rank 3 stopped reporting." for the run's GPU
    faults since its start, or "" when its GPUs reported none."""
    since = int(run.started_at.timestamp()) if run.started_at else None
    found = faults(db, run=run, since=since)
    if not found:
        return ""
    heard: dict[int | None, datetime] = {s.rank: s.heartbeat_at for s in stalled}
    return " " + "; ".join(near(f, last_heard=heard.get(f.rank)) for f in found[:5]) + "."


def gpu_ranks(db: Session, *, run: Run) -> dict[tuple[str, int], int]:
    """(host, NVML index) -> the rank that used that GPU: the ranks on a host in order, each on the GPU of its local
    rank among those its node's inventory lists (the GPUs the launcher made visible, in CUDA's order)."""
    inventory = {str(node["host"]): [int(g["index"]) for g in node.get("gpus") or []]  # type: ignore[attr-defined]
                 for node in run.gpus or []}  # fmt: skip
    on_host: dict[str, list[int]] = {}
    for row in rank_store.rank_rows(db, run_id=run.id):
        on_host.setdefault(row.host, []).append(row.rank)
    found = {}
    for host, ranks in on_host.items():
        for local, rank in enumerate(sorted(ranks)):
            if local < len(inventory.get(host, [])):
                found[(host, inventory[host][local])] = rank
    return found


def _with_rank(fault: GpuFault, ranks: dict[tuple[str, int], int]) -> GpuFault:
    rank = ranks.get((fault.host, fault.index))
    return fault if rank is None else GpuFault(fault.kind, fault.host, fault.index, fault.at, fault.what, rank)


def diagnoses(db: Session, *, run: Run) -> list[DiagnosisOut]:
    """The run's GPU faults as "What went wrong" reads them: one per kind and GPU, the first of each."""
    since = int(run.started_at.timestamp()) if run.started_at else None
    first: dict[tuple[str, str, int], GpuFault] = {}
    for fault in faults(db, run=run, since=since):
        first.setdefault((fault.kind, fault.host, fault.index), fault)
    return [_diagnosis(fault) for fault in first.values()]


def _diagnosis(fault: GpuFault) -> DiagnosisOut:
    rank = f" (used by rank {fault.rank})" if fault.rank is not None else ""
    cause = f"{fault.sentence}{rank}: the GPU itself failed or degraded, which no code of the run causes or survives."
    if fault.kind == "hw_slowdown":
        cause = f"{fault.sentence}{rank}: the GPU ran slower than it should, and the other ranks waited for it."
    return DiagnosisOut(kind=f"gpu_{fault.kind}", title=TITLES[fault.kind], cause=cause, advice=ADVICE[fault.kind],
                        rank=fault.rank, ranks=[] if fault.rank is None else [fault.rank], line=fault.sentence,
                        traceback=None, log_rank=fault.rank, stream="stderr")  # fmt: skip


def near(fault: GpuFault, *, last_heard: datetime | None) -> str:
    """The fault's sentence, with how long before (or after) the rank on its GPU stopped reporting."""
    if fault.rank is None or last_heard is None:
        return fault.sentence
    gap = round(last_heard.timestamp() - fault.at)
    when = f"{gap} s before" if gap >= 0 else f"{-gap} s after"
    return f"{fault.sentence}, {when} rank {fault.rank} stopped reporting"
