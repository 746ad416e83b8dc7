"""The run page's view model: everything the page and its live fragments show, read at one moment.

One function reads it in one read transaction: the run, its health, goodput, dump, findings and files, each part
once. The page, the stream's fragments (status, files, output), the charts fragment and the answers to Stop and to a
checkpoint's deletion all render from it. Nothing in it goes back to the database: its parts are values (mostly the
API's own shapes), so rendering can happen after the session has closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from app.core.folders import RunFolders
from app.core.models import Run, RunStatus, utcnow
from app.core.settings import Settings
from app.launcher.launchers import kind
from app.schemas.alerts import AlertDeliveryOut
from app.schemas.checkpoints import CheckpointOut, CheckpointRemoval
from app.schemas.comm import CommShare
from app.schemas.forensics import DumpOut, FindingsOut
from app.schemas.goodput import Goodput
from app.schemas.health import HealthOut
from app.schemas.logs import RankOutput
from app.schemas.mfu import Mfu
from app.schemas.preflight import Preflight
from app.schemas.runs import RunDetail
from app.schemas.sweeps import Sweep
from app.services import alerts, checkpoints, comm, files, findings, forensics, health, preflight, runs
from app.services.goodput import STARTUP_PHASES, run_goodput
from app.services.mfu import run_mfu
from app.services.run_charts import RunCharts, run_charts
from app.services.sweeps import sweep_of


@dataclass(frozen=True)
class Progress:
    """How far the run is, and how long it has taken."""

    elapsed: timedelta | None  # since its latest launch; None while it waits to be launched
    eta: timedelta | None  # only while it trains and moves: a stalled or waiting run will not end at its pace so far
    percent: float  # of its total steps
    reason: str  # its status's reason; empty while the health box tells the same stall live


@dataclass(frozen=True)
class RunFiles:
    """What the run left in the shared folder: checkpoints, those the retention policy removed, each rank's output."""

    checkpoint_dir: Path
    checkpoints: tuple[CheckpointOut, ...]
    removals: tuple[CheckpointRemoval, ...]
    outputs: tuple[RankOutput, ...]  # only those with lines
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
    charts: RunCharts
    alerts: tuple[AlertDeliveryOut, ...]
    stop_grace: timedelta  # how long Stop waits for the trainer before it kills


def run_page_view(db: Session, *, run_id: int, folders: RunFolders, settings: Settings) -> RunPageView:
    """The run page of the run with this id, now, in one read transaction; raises RunNotFound."""
    now = utcnow()
    with db.begin():
        run = runs.get_run(db, run_id=run_id)
        state = health.assess(db, run, now=now, stall_after=timedelta(seconds=settings.stall_after_s))
        return RunPageView(
            run=RunDetail.model_validate(run, from_attributes=True),
            progress=_progress(run, state, now=now),
            health=state,
            dump=forensics.latest_dump(db, run=run, folders=folders, world_size=kind(run.launcher).ranks(run)),
            findings=findings.findings(db, run=run),
            files=_files(run, folders=folders),
            efficiency=_efficiency(db, run, folders=folders, now=now),
            charts=run_charts(db, run=run),
            alerts=tuple(AlertDeliveryOut.model_validate(d) for d in alerts.run_deliveries(db, run_id=run.id)),
            stop_grace=timedelta(seconds=settings.stop_grace_s),
        )


def _progress(run: Run, state: HealthOut, *, now: datetime) -> Progress:
    elapsed = runs.elapsed(run, now)
    moving = run.status == RunStatus.running and state.state == "ok"
    eta = None
    if elapsed is not None and 0 < run.step < run.total_steps and moving:
        eta = elapsed * ((run.total_steps - run.step) / run.step)
    # While the health box tells the stall live, its event's words (frozen at the time) would only repeat it.
    told = state.state != "ok" and run.status_reason.startswith(health.NOT_PROGRESSING)
    percent = 100 * run.step / run.total_steps if run.total_steps else 0
    return Progress(elapsed, eta, percent, "" if told else run.status_reason)


def _files(run: Run, *, folders: RunFolders) -> RunFiles:
    return RunFiles(
        checkpoint_dir=folders.checkpoint_dir(run),
        checkpoints=tuple(checkpoints.list_checkpoints(run, folders=folders, best_metric=run.best_metric or "loss")),
        removals=tuple(checkpoints.removals(run, folders=folders)),
        outputs=tuple(output for output in files.rank_outputs(run, folders=folders) if output.lines),
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
        sweep=sweep_of(db, run_id=run.id),
    )
