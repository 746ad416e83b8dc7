"""What every launcher does for the services: start a run's processes, tell how they are, and end them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from app.core.models import Run, RunStatus


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
    """A scheduler's word on a run's job: its state, why it waits, the nodes it holds."""

    state: str
    reason: str
    nodes: str


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
    """The process side of a run; its folders belong to storage (app.core.folders), its options to the run."""

    name: str  # as the API and the pages say it: "local", "slurm"

    def refresh(self, runs: Sequence[Run]) -> None:
        """One look at all of this launcher's live runs, before a tick asks about each (one squeue, not N)."""
        ...

    def observe(self, run: Run) -> JobView | None:
        """The scheduler's view of the run's job, when there is a scheduler."""
        ...

    def verdict(self, run: Run) -> tuple[RunStatus, str] | None:
        """How an ended run ended in the scheduler's words, when the trainer's markers and a stop do not say."""
        ...

    def world_size(self, run: Run) -> int:
        """How many ranks the run will have once started: what MFU, goodput and the dumps count by."""
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
