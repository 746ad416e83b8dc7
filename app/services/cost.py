"""What a run cost: the devices it held from each launch to its end, the energy its GPUs drew, the money at the admin's
price per GPU model (RANKBOARD_GPU_PRICES), and the goodput ledger's parts of that time in the same units.

- Devices held: a Slurm run's GPUs as its job asked for them (nodes x GPUs per node), else the GPUs in the inventory
  its nodes' samplers reported (one per process on this host), else it ran on CPUs: then processes, in CPU-hours.
- Held time: each launch to the end of its processes, as the goodput ledger lays out its stretches. The ledger's whole
  also counts the wait before each launch (queue, and the wait after a preemption), when nothing is held: that wait
  is taken out of its parts and shown apart, as hours, at no cost. What is left of each part, in process-seconds,
  is its share of the held devices, so the parts' device-hours add up to the held device-hours.
- Energy per GPU and launch: NVML's total-energy counter (`gpu/<host>/<index>/energy`, J) where the GPU reports it,
  last minus first reading (only those two chunks are read), with the sampled power before its first and after its
  last reading; where it went down between them (a driver reload) or has no two readings, the trapezoid
  integral of sampled power over time, bridging no gap longer than GAP_INTERVALS sample intervals (the sampler was
  away: what the GPU drew then is unknown, not zero nor the neighbours' mean).
- A part's energy and money are its share of the held device-hours: the ledger says where the time went, not the
  watts of each second.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy.orm import Session

from app.core.errors import RunNotFound
from app.core.models import Run, utcnow
from app.launcher.launchers import kind
from app.schemas.goodput import Goodput
from app.schemas.usage import Attempt, CostPart, EnergyMethod, RunCost
from app.services.goodput import PART_LABELS, _segments, run_goodput
from app.store import chunks
from app.store import runs as run_store
from app.store import usage as usage_store

GOOD = "training"
UNKNOWN = ("pending", "unitemized")  # not badput: not yet reported, or not told apart from training
WAITING = ("queue", "preempted")  # the ledger's names for the wait before a launch
GAP_INTERVALS = 5.0
JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True)
class Held:
    """What a run holds while launched: GPUs (with their models where known), or CPU processes."""

    gpus: int
    processes: int
    models: tuple[str, ...]  # each GPU's name as NVML gave it, from the inventory
    basis: str

    @property
    def units(self) -> int:
        return self.gpus or self.processes


@dataclass(frozen=True)
class Window:
    """One launch to the end of its processes, in unix seconds."""

    launch: float
    end: float
    live: bool


def held_by(run: Run) -> Held:
    """The GPUs the run held, from its job's request or its inventory; its processes on CPUs otherwise."""
    processes = kind(run.launcher).ranks(run)
    nodes = run.gpus or []
    models = tuple(str(gpu.get("name", "")) for node in nodes for gpu in node.get("gpus", []))  # type: ignore[attr-defined]
    if run.slurm_gpus_per_node > 0:  # only a Slurm job asks for GPUs per node: it holds them, used or not
        gpus = run.slurm_nodes * run.slurm_gpus_per_node
        return Held(gpus, processes, models, f"{run.slurm_nodes} node(s) x {run.slurm_gpus_per_node} GPUs, as asked")
    if models:
        return Held(len(models), processes, models, f"{len(models)} GPU(s) on {len(nodes)} node(s), as sampled")
    why = "its nodes have no GPU" if nodes else "no node reported a GPU"
    return Held(0, processes, (), f"{processes} CPU process(es): {why}")


def price_of(model: str, prices: Mapping[str, float]) -> float | None:
    """Dollars per hour of a GPU of this model: the longest priced model its name holds, any case; None if none."""
    found = [(len(name), price) for name, price in prices.items() if name.casefold() in model.casefold()]
    return max(found)[1] if found else None


def cost_of(db: Session, *, run_id: int, prices: Mapping[str, float]) -> RunCost:
    """What the run with this id cost so far, in one read transaction; raises RunNotFound."""
    with db.begin():
        run = run_store.get_run(db, run_id)
        if run is None:
            raise RunNotFound(run_id)
        now = utcnow()
        return run_cost(db, run=run, goodput=run_goodput(db, run=run, now=now), prices=prices, now=now)


def run_cost(db: Session, *, run: Run, goodput: Goodput, prices: Mapping[str, float], now: datetime) -> RunCost:
    """What `run` cost as of `now`, its parts from `goodput` (the run's, computed at the same `now`)."""
    windows = windows_of(run, now=now)
    series = usage_store.energy_series(db, run_ids=[run.id]).get(run.id, {})
    joules, method = gpu_energy(db, series, windows)
    return assemble(run, goodput, windows, joules, method, prices=prices)


def windows_of(run: Run, *, now: datetime) -> list[Window]:
    """The run's launches, as the goodput ledger's stretches have them."""
    stretches = _segments(run, list(run.events), now=now.timestamp())
    return [Window(s.launch, s.end, s.live) for s in stretches if s.launch is not None and s.end >= s.launch]


def assemble(
    run: Run, goodput: Goodput, windows: list[Window], joules: list[float | None], method: EnergyMethod, *,
    prices: Mapping[str, float],
) -> RunCost:  # fmt: skip
    """The run's cost from its parts: pure, so that a usage report of thousands reads each run's series once."""
    held = held_by(run)
    attempts = [_attempt(window, held, energy) for window, energy in zip(windows, joules, strict=True)]
    device_hours = sum(a.device_hours for a in attempts)
    known = [a.kwh for a in attempts if a.kwh is not None]
    kwh = sum(known) if known else None
    price, note = _price(held, prices)
    cost = device_hours * price if price is not None else None
    parts, queued = _parts(goodput, windows, held, kwh=kwh, cost=cost, whole=device_hours)
    lost = [p for p in parts if p.lost]
    trained = sum(p.device_hours for p in parts if p.name == GOOD)
    return RunCost(
        run_id=run.id, device="gpu" if held.gpus else "cpu", unit="GPU-hours" if held.gpus else "CPU-hours",
        devices=held.units, held_from=held.basis, gpu_models=sorted(set(held.models)), device_hours=device_hours,
        energy_kwh=kwh, energy_method=method, price_per_hour=price, cost=cost, cost_note=note, queued_hours=queued,
        attempts=attempts, parts=parts,
        goodput=trained / device_hours if goodput.itemized and device_hours > 0 else None, itemized=goodput.itemized,
        lost_device_hours=sum(p.device_hours for p in lost), lost_kwh=_sum_known(p.kwh for p in lost),
        lost_cost=_sum_known(p.cost for p in lost), sentences=_sentences(run, parts, held),
    )  # fmt: skip


def _attempt(window: Window, held: Held, joules: float | None) -> Attempt:
    hours = (window.end - window.launch) / 3600
    return Attempt(
        launched_at=datetime.fromtimestamp(window.launch, timezone.utc),
        ended_at=datetime.fromtimestamp(window.end, timezone.utc), live=window.live, hours=hours,
        device_hours=hours * held.units, kwh=None if joules is None else joules / JOULES_PER_KWH,
    )  # fmt: skip


def _price(held: Held, prices: Mapping[str, float]) -> tuple[float | None, str]:
    """The mean price of the run's GPUs, and what it came from (or why there is none)."""
    if not held.gpus:
        return None, "a run on CPUs: no GPU price applies"
    if not held.models:
        return None, "its GPU models are not known yet (no node has reported its GPUs)"
    each = {model: price_of(model, prices) for model in set(held.models)}
    missing = sorted(model for model, price in each.items() if price is None)
    if missing:
        return None, f"no price is set for {', '.join(missing)} (RANKBOARD_GPU_PRICES)"
    return mean_price(Counter(held.models), prices), ", ".join(f"{m} at ${each[m]:.2f}/h" for m in sorted(each))


def mean_price(models: Mapping[str, int], prices: Mapping[str, float]) -> float | None:
    """Dollars per hour of these GPUs ({model: how many}) at the mean of their prices; None without a GPU or with one
    unpriced."""
    each = [(price_of(model, prices), count) for model, count in models.items()]
    if not each or any(price is None for price, _ in each):
        return None
    return sum((price or 0.0) * count for price, count in each) / sum(count for _, count in each)


def _parts(
    goodput: Goodput, windows: list[Window], held: Held, *, kwh: float | None, cost: float | None, whole: float
) -> tuple[list[CostPart], float]:
    """The ledger's parts within the held time, in device-hours, kWh and dollars; and the hours waited before."""
    processes = max(goodput.processes, 1)
    waited = goodput.wall_s - sum(w.end - w.launch for w in windows)  # before each launch, and never launched
    seconds = {part.name: part.seconds for part in goodput.parts}
    left = waited * processes
    for name in WAITING:  # the wait is laid as queue (or preempted, after a preemption); any rest of it is held
        taken = min(seconds.get(name, 0.0), left)
        seconds[name] = seconds.get(name, 0.0) - taken
        left -= taken
    parts = []
    for name, value in seconds.items():
        hours = value / processes * held.units / 3600
        share = hours / whole if whole > 0 else 0.0
        if hours <= 0 and name != GOOD:
            continue
        parts.append(CostPart(name=name, label=PART_LABELS[name], device_hours=hours, share=share,
                              kwh=None if kwh is None else kwh * share, cost=None if cost is None else cost * share,
                              lost=name not in (GOOD, *UNKNOWN)))  # fmt: skip
    return parts, max(0.0, waited) / 3600


def _sentences(run: Run, parts: list[CostPart], held: Held) -> list[str]:
    """What the page says of the money lost: to restarts (and steps taken again), then in all."""
    unit = "GPU-hours" if held.gpus else "CPU-hours"
    restarted = [p for p in parts if p.name in ("restarts", "repeated")]
    said = []
    if restarted and (hours := sum(p.device_hours for p in restarted)) > 0:
        who = f"This run's {run.restarts} restart{'s' if run.restarts != 1 else ''}" if run.restarts else "Restarts"
        said.append(f"{who} cost {_number(hours)} {unit}{_dollars(_sum_known(p.cost for p in restarted))}.")
    lost = [p for p in parts if p.lost]
    if lost and (hours := sum(p.device_hours for p in lost)) > 0:
        biggest = max(lost, key=lambda p: p.device_hours)
        said.append(f"Badput: {_number(hours)} {unit}{_dollars(_sum_known(p.cost for p in lost))} bought no new "
                    f"training; most of it {biggest.label}.")  # fmt: skip
    return said


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _dollars(value: float | None) -> str:
    return "" if value is None else f", ${value:,.2f}"


def _sum_known(values: Iterable[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def gpu_energy(
    db: Session, series: Mapping[usage_store.Gpu, Mapping[str, int]], windows: list[Window]
) -> tuple[list[float | None], EnergyMethod]:
    """Joules of each window over the run's GPUs (None where none was sampled), and how they were measured."""
    totals: list[float | None] = [None] * len(windows)
    methods: set[EnergyMethod] = set()
    if not windows:
        return totals, "none"
    for fields in series.values():
        for index, window in enumerate(windows):
            counter = None
            if "energy" in fields:
                counter = usage_store.readings_at_ends(db, series_id=fields["energy"], first=math.floor(window.launch),
                                                       last=math.ceil(window.end))  # fmt: skip
            joules, method = _gpu_joules(db, counter, fields.get("power"), window)
            if joules is not None:
                totals[index] = (totals[index] or 0.0) + joules
                methods.add(method)
    if len(methods) == 2:
        return totals, "counter and integral of power"
    return totals, methods.pop() if methods else "none"


def _within(points: chunks.Points, begin: float, end: float) -> chunks.Points:
    return points.take((points.times >= begin) & (points.times <= end))


def _gpu_joules(
    db: Session, counter: chunks.Points | None, power: int | None, window: Window
) -> tuple[float | None, EnergyMethod]:
    """One GPU's joules in one window: the counter's rise between its first and last sample there, with the sampled
    power before and after them (NVML's counter is read once a minute: a launch's first and last minute would be
    lost; only those edges of the power series are read); else the integral of power alone."""
    mine = None if counter is None else _within(counter, window.launch, window.end)
    rise = None if mine is None else counter_joules(mine.times, mine.values)
    if mine is not None and rise is not None:
        low, high = float(mine.times.min()), float(mine.times.max())
        edges = [(window.launch, low), (high, window.end)] if power is not None else []
        return rise + sum(_power_joules(db, power, begin, end) or 0.0 for begin, end in edges), "counter"
    if power is None:
        return None, "none"
    return _power_joules(db, power, window.launch, window.end), "integral of power"


def _power_joules(db: Session, series_id: int | None, begin: float, end: float) -> float | None:
    assert series_id is not None
    points = _within(chunks.read(db, series_id=series_id, first=math.floor(begin), last=math.ceil(end)), begin, end)
    return power_joules(points.times, points.values)


def counter_joules(times: object, values: object) -> float | None:
    """A cumulative counter's rise from its first to its last reading; None under two readings, or where it went
    down (the driver reloaded: what was counted before is not known)."""
    import numpy as np

    order = np.argsort(times)  # type: ignore[arg-type]
    counter = np.asarray(values, dtype=np.float64)[order]
    counter = counter[np.isfinite(counter)]
    if len(counter) < 2 or counter[-1] < counter[0]:
        return None
    return float(counter[-1] - counter[0])


def power_joules(times: object, values: object) -> float | None:
    """The trapezoid integral of power (W) over time (s), not across gaps of over GAP_INTERVALS sample intervals."""
    import numpy as np

    at = np.asarray(times, dtype=np.float64)
    watts = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(watts) & np.isfinite(at)
    at, watts = at[keep], watts[keep]
    order = np.argsort(at)
    at, watts = at[order], watts[order]
    if len(at) < 2:
        return None
    steps = np.diff(at)
    bridged = steps <= GAP_INTERVALS * float(np.median(steps))
    return float((steps * (watts[1:] + watts[:-1]) / 2)[bridged].sum())
