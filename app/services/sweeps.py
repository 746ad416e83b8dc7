"""Scaling sweeps: what adding processes buys. The same config queued at 1, 2, 4, ... processes for one epoch each,
then a table of throughput, speed-up over the 1-process run, and efficiency (speed-up over processes; the DDP
checklist expects ~90-95% at 2 GPUs, ~88-95% at 4, ~80-95% at 8), with each run's communication share.

Each run of a sweep is an ordinary run (its own page, checkpoints, goodput), marked with the run it was started from
(`sweep_of`). One epoch bounds it: the same data per run, split over more ranks, so the larger runs are shorter.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.errors import FieldInvalid
from app.core.folders import RunFolders
from app.core.models import Run
from app.core.settings import Settings
from app.launcher.launchers import Launchers, kind
from app.schemas.runs import RunCreate
from app.schemas.sweeps import Sweep, SweepRow
from app.services import comm, runs

MAX_PROCESSES = 64


def sizes(*, capacity: int) -> list[int]:
    """1, 2, 4, ... up to what this host can hold at once."""
    found, n = [], 1
    while n <= min(capacity, MAX_PROCESSES):
        found.append(n)
        n *= 2
    return found


def start_sweep(
    db: Session, *, run_id: int, settings: Settings, folders: RunFolders, launchers: Launchers, actor: str
) -> Sweep:
    """Queue the run's config at each size for one epoch; raises RunNotFound, FieldInvalid where `refusal` says."""
    with db.begin():  # read, and let go: each run is created in its own transaction, as a user's would be
        specs = _specs(runs.get_run(db, run_id=run_id), capacity=launchers.local.capacity)
    for spec in specs:
        runs.create_run(db, spec=spec, settings=settings, folders=folders, launchers=launchers, actor=actor,
                        sweep_of=run_id)  # fmt: skip
    return sweep_of(db, run_id=run_id)


def refusal(run: Run) -> str | None:
    """Why the run's options cannot be swept; None where they can: a built-in workload, on this host."""
    if run.script:  # its epochs (if any) are its arguments', and its throughput whatever it chose to report
        return "a scaling sweep trains a built-in workload for one epoch at each size; this run is of a script"
    return kind(run.launcher).sweep_refusal(run)


def _specs(origin: Run, *, capacity: int) -> list[RunCreate]:
    """The origin's options at each size, for one epoch, without restarts."""
    if why := refusal(origin):
        raise FieldInvalid("launcher" if origin.script is None else "script", why)
    options = RunCreate.values_of(origin)
    return [RunCreate.model_validate({**options, "nproc_per_node": processes, "epochs": 1, "max_restarts": 0,
                                      "name": f"{origin.name[:60]} · sweep {processes}p"})
            for processes in sizes(capacity=capacity)]  # fmt: skip


def sweep_of(db: Session, *, run_id: int) -> Sweep:
    """The table of the run's sweep (the newest run of each size); raises RunNotFound."""
    runs.get_run(db, run_id=run_id)
    members = db.scalars(select(Run).where(Run.sweep_of == run_id).order_by(Run.id)).all()
    newest = {run.nproc_per_node: run for run in members}
    base = newest.get(1)
    rows = []
    for processes, run in sorted(newest.items()):
        speedup = run.samples_per_s / base.samples_per_s if base and base.samples_per_s and run.samples_per_s else None
        share = comm.comm_share(db, run_id=run.id)
        rows.append(SweepRow(run_id=run.id, processes=processes, status=run.status.value,
                             samples_per_s=run.samples_per_s, speedup=speedup,
                             efficiency=speedup / processes if speedup else None,
                             comm_share=share.share if share else None))  # fmt: skip
    return Sweep(run_id=run_id, rows=rows)
