"""What every launcher does for the services: start a run's processes, tell how they are, and end them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from app.models import Run


@dataclass(frozen=True)
class Launch:
    """What the launcher started, as the run records it."""

    launch_id: str
    pid: int
    start_ticks: int | None
    command: list[str]


class Launcher(Protocol):
    """The process side of a run; its folders belong to storage (app.folders), its options to the run."""

    name: str  # as the API and the pages say it: "local"

    def start(self, run: Run, *, token: str, devices: list[int]) -> Launch:
        """Starts the run; `token` travels in the processes' environment only."""
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
