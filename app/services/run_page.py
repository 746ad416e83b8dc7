"""The run page's view model: everything the page and its live fragments show, read at one moment.

One function reads it in one read transaction: the run, its health, goodput, dump, findings and files, each part
once. The page, the stream's fragments (status, files, output), the charts fragment and the answers to Stop and to a
checkpoint's deletion all render from it. Nothing in it goes back to the database: its parts are values (mostly the
API's own shapes), so rendering can happen after the session has closed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.errors import RunNotFound
from app.core.folders import RunFolders
from app.core.models import MetricSummary, Run, RunStatus, utcnow
from app.core.settings import Settings
from app.launcher.launchers import kind, trains_builtin
from app.schemas.alerts import AlertDeliveryOut
from app.schemas.checkpoints import CheckpointOut, CheckpointRemoval
from app.schemas.comm import CommShare
from app.schemas.forensics import DumpOut, FindingsOut
from app.schemas.goodput import Goodput
from app.schemas.health import HealthOut
from app.schemas.mfu import Mfu
from app.schemas.preflight import Preflight
from app.schemas.runs import RunDetail
from app.schemas.sweeps import Sweep
from app.schemas.usage import RunCost
from app.services import alerts, checkpoints, comm, files, findings, forensics, health, preflight, runs, sweeps
from app.services.cost import run_cost
from app.services.goodput import STARTUP_PHASES, run_goodput
from app.services.metrics import CLOCK_STEPPED
from app.services.mfu import run_mfu
from app.services.run_charts import RunCharts, run_charts
from app.store import chunks
from app.store import metrics as metric_store
from app.store import runs as run_store
from app.store.goodput import LEDGER_PREFIX

# The keys whose points are not at training steps: the samplers' (at unix seconds) and goodput's (at a report number).
NOT_AT_STEPS = (*CLOCK_STEPPED, LEDGER_PREFIX)
RATE_POINTS = 256  # a step rate is read over the newest points of the series that got furthest
RATE_SERIES = 3  # of the series that got furthest, how many are tried: one may hold a single final point


@dataclass(frozen=True)
class Throughput:
    """The rate the page shows, of what the run reports: samples or tokens a second, else steps a second."""

    label: str  # "Samples/s", "Tokens/s" or "Steps/s"
    per_s: float | None  # None while nothing says

    @property
    def text(self) -> str:
        """The rate as the page writes it: whole samples or tokens; a slow step rate with its fraction."""
        if self.per_s is None:
            return "–"
        return f"{self.per_s:.3g}" if self.label == "Steps/s" and self.per_s < 100 else f"{self.per_s:,.0f}"


@dataclass(frozen=True)
class Progress:
    """How far the run is, and how long it has taken: only against what it declared, at the rate it reports."""

    elapsed: timedelta | None  # since its latest launch; None while it waits to be launched
    eta: timedelta | None  # only while it trains and moves: a stalled or waiting run will not end at its pace so far
    percent: float  # of its total steps; 0 without one
    reason: str  # its status's reason; empty while the health box tells the same stall live
    # The built-in trainer, which declares its epochs and its total of steps and reports samples a second: its page
    # holds their places ("of ?") until it does. A script's or a run's launched elsewhere shows only what it reported.
    builtin: bool
    epoch: int | None  # None where the run reports no epoch
    total_steps: int | None  # as declared (the built-in trainer; report.init(total_steps=...)); None: unknown
    throughput: Throughput


@dataclass(frozen=True)
class RunFiles:
    """What the run left in the shared folder: checkpoints, those the retention policy removed, its job script (each
    rank's output is the logs panel's, which reads it on its own stream)."""

    checkpoint_dir: Path
    checkpoints: tuple[CheckpointOut, ...]
    removals: tuple[CheckpointRemoval, ...]
    job_script: str | None  # a Slurm run's batch script


@dataclass(frozen=True)
class Efficiency:
    """What the GPUs bought: goodput, the communication share, MFU, the preflight check and the scaling sweep."""

    goodput: Goodput
    startup_labels: Mapping[str, str]  # goodput's start-up phases as a person reads them
    comm: CommShare | None
    comm_sentence: str  # what the page says of the communication share, with its numbers; "" without one
    comm_dominates: bool  # communication takes enough of the step that the page says what would help
    mfu: Mfu | None
    preflight: Preflight | None
    sweep: Sweep
    sweep_refusal: str | None  # why the page offers no scaling sweep of this run; None where it does


@dataclass(frozen=True)
class RunPageView:
    """Everything the run page and its fragments show, as read at one moment."""

    run: RunDetail  # with its lifecycle events and audit
    progress: Progress
    health: HealthOut
    dump: DumpOut | None
    findings: FindingsOut
    files: RunFiles
    efficiency: Efficiency
    cost: RunCost  # what its launches held and cost, and its goodput's lost parts in the same units
    charts: RunCharts
    alerts: tuple[AlertDeliveryOut, ...]
    stop_grace: timedelta  # how long Stop waits for the trainer before it kills


def run_page_view(db: Session, *, run_id: int, folders: RunFolders, settings: Settings) -> RunPageView:
    """The run page of the run with this id, now, in one read transaction; raises RunNotFound."""
    now = utcnow()
    with db.begin():
        run = runs.get_run(db, run_id=run_id)
        state = health.assess(db, run, now=now, stall_after=timedelta(seconds=settings.stall_after_s))
        efficiency = _efficiency(db, run, folders=folders, now=now)
        return RunPageView(
            run=RunDetail.model_validate(run, from_attributes=True),
            progress=_progress(db, run, state, now=now),
            health=state,
            dump=forensics.latest_dump(db, run=run, folders=folders, world_size=kind(run.launcher).ranks(run)),
            findings=findings.findings(db, run=run),
            files=_files(run, folders=folders),
            efficiency=efficiency,
            cost=run_cost(db, run=run, goodput=efficiency.goodput, prices=settings.gpu_prices, now=now),
            charts=run_charts(db, run=run),
            alerts=tuple(AlertDeliveryOut.model_validate(d) for d in alerts.run_deliveries(db, run_id=run.id)),
            stop_grace=timedelta(seconds=settings.stop_grace_s),
        )


def run_is_over(db: Session, *, run_id: int) -> bool:
    """Whether the run with this id is over, read alone (a stream of points ends on it; the view reads every rank's
    times for its stragglers); raises RunNotFound."""
    with db.begin():
        status = run_store.status_of(db, run_id)
    if status is None:
        raise RunNotFound(run_id)
    return status.is_final


def _progress(db: Session, run: Run, state: HealthOut, *, now: datetime) -> Progress:
    elapsed = runs.elapsed(run, now)
    moving = run.status == RunStatus.running and state.state == "ok"
    eta = None
    if elapsed is not None and 0 < run.step < run.total_steps and moving:
        eta = elapsed * ((run.total_steps - run.step) / run.step)
    # While the health box tells the stall live, its event's words (frozen at the time) would only repeat it.
    told = state.state != "ok" and run.status_reason.startswith(health.NOT_PROGRESSING)
    percent = 100 * run.step / run.total_steps if run.total_steps else 0
    builtin = trains_builtin(run)
    # Epoch 0 is what the column holds before any report: a script that counts from 0 shows its epoch from 1 on.
    epoch = run.epoch if builtin or run.epoch > 0 else None
    return Progress(elapsed, eta, percent, "" if told else run.status_reason, builtin=builtin, epoch=epoch,
                    total_steps=run.total_steps or None,
                    throughput=_throughput(db, run, builtin=builtin, elapsed=elapsed))  # fmt: skip


def _throughput(db: Session, run: Run, *, builtin: bool, elapsed: timedelta | None) -> Throughput:
    """Samples a second where the run reports them (its progress, or a metric), tokens where it logs those, else
    its steps a second."""
    if builtin or run.samples_per_s > 0:
        return Throughput("Samples/s", run.samples_per_s)
    for key, label in (("samples_per_s", "Samples/s"), ("tokens_per_s", "Tokens/s")):
        value = metric_store.last_value(db, run_id=run.id, key=key)
        if value is not None and math.isfinite(value):
            return Throughput(label, value)
    return Throughput("Steps/s", _step_rate(db, run, elapsed=elapsed))


def _step_rate(db: Session, run: Run, *, elapsed: timedelta | None) -> float | None:
    """Steps a second over the newest points of the series that got furthest, by the clock that logged them (a
    resumed run's steps did not all happen since its launch); else over its launch so far."""
    furthest = db.scalars(
        select(MetricSummary.series_id)
        .where(
            MetricSummary.run_id == run.id, *(~MetricSummary.key.startswith(p, autoescape=True) for p in NOT_AT_STEPS)
        )
        .order_by(MetricSummary.last_step.desc())
        .limit(RATE_SERIES)
    ).all()
    for series_id in furthest:
        if (rate := _rate(chunks.newest_points(db, series_id=series_id, limit=RATE_POINTS))) is not None:
            return rate
    seconds = elapsed.total_seconds() if elapsed is not None else 0.0
    return run.step / seconds if run.step > 0 and seconds > 0 else None


def _rate(points: chunks.Points) -> float | None:
    """Steps a second from the first to the last of these points, of their lowest rank; None where they span none."""
    if len(points) < 2:
        return None
    mine = points.take(points.ranks == points.ranks.min())
    steps, seconds = float(mine.steps[-1] - mine.steps[0]), float(mine.times[-1] - mine.times[0])
    return steps / seconds if steps > 0 and seconds > 0 else None


def _files(run: Run, *, folders: RunFolders) -> RunFiles:
    return RunFiles(
        checkpoint_dir=folders.checkpoint_dir(run),
        checkpoints=tuple(checkpoints.list_checkpoints(run, folders=folders, best_metric=run.best_metric or "loss")),
        removals=tuple(checkpoints.removals(run, folders=folders)),
        job_script=files.job_script(run, folders=folders),
    )


def _efficiency(db: Session, run: Run, *, folders: RunFolders, now: datetime) -> Efficiency:
    share = comm.comm_share(db, run_id=run.id)
    return Efficiency(
        goodput=run_goodput(db, run=run, now=now),
        startup_labels=STARTUP_PHASES,
        comm=share,
        comm_sentence=comm.sentence(share) if share else "",
        comm_dominates=share is not None and comm.dominates(share),
        mfu=run_mfu(db, run=run),
        preflight=preflight.read(run, folders=folders),
        sweep=sweeps.sweep_of(db, run_id=run.id),
        sweep_refusal=sweeps.refusal(run),
    )
