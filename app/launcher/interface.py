"""What every launcher does for the services: start a run's processes, tell how they are, and end them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from app.core.folders import RunFolders
from app.core.models import Run, RunStatus
from app.schemas.runs import RunCreate


@dataclass(frozen=True)
class Launch:
    """What the launcher started, as the run records it: a process on this host, or a scheduler's job."""

    launch_id: str
    pid: int | None
    start_ticks: int | None
    command: list[str]
    description: str  # the run's event: where it went ("torchrun started (pid 12) on GPUs [0, 1]")
    job_id: str | None = None


@dataclass(frozen=True)
class JobView:
    """A scheduler's word on a run's job: its state, why it waits, the nodes it holds; and what that means for the
    run: still in the scheduler's queue, holding nodes, and the words its event says it in."""

    state: str
    reason: str
    nodes: str
    waiting: bool = False
    running: bool = False
    words: str = ""


@dataclass(frozen=True)
class Requeue:
    """A job going back to the queue as the same run: `reason` for the run's event, or `waiting` for the job to end."""

    reason: str = ""
    waiting: bool = False


class LaunchRefused(Exception):
    """The scheduler would not take the run; `message` is its own words."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Launcher(Protocol):
    """The process side of a run; its folders belong to storage (app.core.folders), its options to the run.

    A kind of run is one class: what the services and the pages ask of a stored run (the static methods and class
    variables) needs only the run and its folders, so it is asked of the class (`launchers.kind`) from anywhere; what
    starts, watches and ends processes is asked of the server's instance (`Launchers.for_run`)."""

    name: str  # as the API and the pages say it, and as a run stores it: "local", "slurm", "external"
    # Its processes join the run themselves, each with a token of its own, and say how they ended; a stop reaches them
    # in the reply to their next batch, and only their reports say they live (rankboard.report, services.external).
    joins: bool
    kills: bool  # it can end the run's processes: a stop past its grace kills them
    # Its runs take this host's process slots: they wait in the server's queue, within its limits, by priority, and
    # may be preempted (app.services.scheduling). Others wait in their scheduler's queue, or in none.
    host_slots: bool
    scheduler: str  # the scheduler whose job holds the run ("Slurm"), for the page; "" where there is none
    waits_for: str  # what a queued run waits for, as its first event says it
    stop_words: str  # how a stop reaches the run's processes, as its event says it

    @staticmethod
    def ranks(run: Run) -> int:
        """How many ranks the run has: as its launcher counted them (recorded when it was made, launched or joined);
        for a run stored before runs kept their size, as its options count them."""
        ...

    @staticmethod
    def output_file(run: Run, folders: RunFolders) -> Path | None:
        """The launcher's own output of the run's latest launch; None where there is none (yet) in the run's folder."""
        ...

    @staticmethod
    def output_label(run: Run) -> str:
        """The launcher's own output as the logs panel offers it."""
        ...

    @staticmethod
    def job_script(run: Run, folders: RunFolders) -> Path | None:
        """The script the run was submitted with, when a scheduler took one."""
        ...

    @staticmethod
    def takes_batch(run: Run, *, now: datetime) -> bool:
        """Whether the run's processes' batches are still taken: they may still send while it is in this status."""
        ...

    @staticmethod
    def stop_refusal(run: Run) -> str | None:
        """Why Stop cannot reach this run's processes; None where it can."""
        ...

    @staticmethod
    def resume_refusal(run: Run) -> str | None:
        """Why the dashboard cannot start this run's processes again (Resume); None where it can."""
        ...

    @staticmethod
    def rerun_refusal(run: Run) -> str | None:
        """Why the dashboard cannot re-run this run's options with desync checks; None where it can."""
        ...

    @staticmethod
    def sweep_refusal(run: Run) -> str | None:
        """Why this run's options cannot be swept over process counts on this host; None where they can."""
        ...

    def check_fits(self, spec: RunCreate) -> None:
        """What the schema cannot know: whether this launcher has room for such a run at all. Raises FieldInvalid."""
        ...

    def places(self, run: Run, free: Sequence[int]) -> list[int] | None:
        """The devices of this host a queued run takes from `free` to start now (none: it takes none of this host's);
        None while it does not fit."""
        ...

    def scheduler_options(self, run: Run, *, groups: Sequence[str]) -> dict[str, str | int]:
        """What the server's mapping gives the run's job from its priority and owner (in `groups`), as the run's own
        columns, where the run left them empty: Slurm's QoS, niceness, account and partition; nothing elsewhere."""
        ...

    def refresh(self, runs: Sequence[Run]) -> None:
        """One look at all of this launcher's live runs, before a tick asks about each (one squeue, not N)."""
        ...

    def observe(self, run: Run) -> JobView | None:
        """The scheduler's view of the run's job, when there is a scheduler."""
        ...

    def verdict(self, run: Run) -> tuple[RunStatus, str] | None:
        """How an ended run ended in its launcher's words (Slurm's final state; a run launched elsewhere that fell
        silent), when the trainer's markers and a stop do not say."""
        ...

    def world_size(self, run: Run) -> int:
        """How many ranks the run will have if started now; recorded on the run when it is made and launched, where
        `ranks` reads it for MFU, goodput, the dumps and the logs."""
        ...

    def start(self, run: Run, *, token: str, devices: list[int]) -> Launch:
        """Starts the run; `token` travels in the processes' environment only. Raises LaunchRefused."""
        ...

    def requeue(self, run: Run) -> Requeue | None:
        """Sends an ended run back to the scheduler's queue when it was warned off and allows it; None otherwise."""
        ...

    def exit_code(self, run: Run) -> int | None:
        """How the run's processes ended, or None while they have not (or nothing recorded it)."""
        ...

    def is_alive(self, run: Run) -> bool:
        """Whether the run's processes are still there."""
        ...

    def terminate(self, run: Run) -> None:
        """Asks the run to stop: the trainer finishes its step, checkpoints and exits."""
        ...

    def kill(self, run: Run) -> int:
        """Ends every process of the run at once; returns how many there were."""
        ...

    def worker_failures(self, run: Run) -> list[str]:
        """Each worker death of the latest launch, oldest first, as a person reads it."""
        ...
