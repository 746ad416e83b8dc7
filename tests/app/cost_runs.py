"""Runs with a history, in a real SQLite store, for the cost and usage tests: each run's GPU inventory, power and energy
samples and goodput ledgers go in through the real ingest endpoint while it runs; then its lifecycle (launches,
kills, restarts, stops, resumes) is written as the supervisor would have left it, at fixed times in the past."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import delete

from app.core.models import Run, RunEvent, RunStatus, RunTag
from tests.app.conftest import post, running_run

# A Sunday evening: a run of a few hours crosses into ISO week 46 at midnight.
T0 = datetime(2026, 11, 8, 22, 0, tzinfo=timezone.utc)
HOST = "node-a"
H100 = "NVIDIA H100 80GB HBM3"
COUNTER_EVERY_S = 60  # as the sampler reads NVML's energy counter: once a minute


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@dataclass(frozen=True)
class Wave:
    """A GPU that trains in bursts: `mean` W with a `swing` W sine every `period` s; and its own energy counter."""

    mean: float = 250.0
    swing: float = 150.0
    period: float = 300.0

    def watts(self, t: float) -> float:
        return self.mean + self.swing * math.sin(2 * math.pi * t / self.period)

    def joules(self, t: float) -> float:
        """From T0 to t: the exact integral of `watts`, as NVML's counter counts what the GPU drew."""
        return self.mean * t + self.swing * self.period / (2 * math.pi) * (1 - math.cos(2 * math.pi * t / self.period))


@dataclass
class Ledger:
    """One process incarnation's goodput totals (trainer/goodput.py), seconds after T0."""

    attempt: str
    rank: int
    start: float
    end: float
    steps: tuple[int, int]
    parts: dict[str, float]


@dataclass
class Plan:
    """A run's history: its events (seconds after T0, status, reason), ledgers, GPUs and samples."""

    name: str
    events: list[tuple[float, RunStatus, str]]
    ranks: int = 2
    gpus: list[str] = field(default_factory=lambda: [H100, H100])  # one per GPU on HOST; empty: a CPU node
    ledgers: list[Ledger] = field(default_factory=list)
    power: Wave | None = None  # sampled every second over each launch
    counter: bool = False  # NVML's energy counter too, the integral of `power`, read once a minute
    owner: str = "ada"
    tags: list[str] = field(default_factory=list)
    restarts: int = 0
    script: str | None = None


def build(client: TestClient, plan: Plan) -> int:
    """The run of `plan` in the client's store; returns its id."""
    run_id = running_run(client, plan.name)
    node = {"host": HOST, "gpus": [{"index": i, "uuid": f"GPU-{i}", "name": n} for i, n in enumerate(plan.gpus)],
            "nvml_error": None if plan.gpus else "NVML Shared Library Not Found"}  # fmt: skip
    assert post(client, run_id, {"node": node}).status_code == 200
    for columns in [_ledger_columns(plan.ledgers), *_sample_columns(plan)]:
        for part in range(0, len(columns), 8):
            body = wire.Batch(columns=tuple(columns[part : part + 8])).to_json()
            assert post(client, run_id, body).status_code == 200, body
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        db.execute(delete(RunEvent).where(RunEvent.run_id == run_id))
        db.add_all(RunEvent(run_id=run_id, at=at(s), status=status, reason=reason) for s, status, reason in plan.events)
        last, status, _ = plan.events[-1]
        run.status, run.created_at = status, at(plan.events[0][0])
        run.finished_at = at(last) if status.is_final else None
        run.world_size = run.nproc_per_node = plan.ranks
        run.owner, run.restarts, run.script = plan.owner, plan.restarts, plan.script
        db.add_all(RunTag(run_id=run_id, tag=tag) for tag in plan.tags)
    return run_id


def launches(plan: Plan) -> list[tuple[float, float]]:
    """Each launch to the end of its processes, from the plan's events alone (as a person reads the timeline)."""
    spans, launch = [], None
    for seconds, status, _ in plan.events:
        if status in (RunStatus.starting, RunStatus.running, RunStatus.stopping) and launch is None:
            launch = seconds
        elif launch is not None and (status.is_final or status == RunStatus.queued):
            spans.append((launch, seconds))
            launch = None
    return spans


def _ledger_columns(ledgers: list[Ledger]) -> list[wire.Column]:
    columns = []
    for ledger in ledgers:
        marks = {"start": at(ledger.start).timestamp(), "at": at(ledger.end).timestamp(),
                 "first_step": float(ledger.steps[0]), "step_reached": float(ledger.steps[1])}  # fmt: skip
        for name, value in {**ledger.parts, **marks}.items():
            key = wire.GOODPUT_KEY.format(attempt=ledger.attempt, field=name)
            columns.append(wire.Column(key, ledger.rank, [1], [value], [at(ledger.end).timestamp()]))
    return columns


def _sample_columns(plan: Plan) -> list[list[wire.Column]]:
    """Each GPU's power every second of each launch, and its energy counter every minute (joules since a driver load
    long before), in batches of at most 10,000 points."""
    if plan.power is None:
        return []
    batches = []
    for begin, end in launches(plan):
        seconds = list(range(int(begin), int(end) + 1))
        for index in range(len(plan.gpus)):
            key = wire.GPU_KEY.format(host=HOST, index=index, field="{field}")
            times = [at(s).timestamp() for s in seconds]
            watts = [round(plan.power.watts(s), 3) for s in seconds]
            batches.append([wire.Column(key.format(field="power"), 0, [int(t) for t in times], watts, times)])
            if plan.counter:
                every = seconds[::COUNTER_EVERY_S]
                joules = [round(1e9 + plan.power.joules(s), 3) for s in every]
                stamps = [at(s).timestamp() for s in every]
                batches.append([wire.Column(key.format(field="energy"), 0, [int(t) for t in stamps], joules, stamps)])
    return batches
