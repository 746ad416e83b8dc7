"""Runs launched elsewhere: the user's own sbatch, torchrun or Kubernetes job, whose processes join a run themselves.

No process of theirs is the server's to start, signal or wait for: what this launcher knows of them comes from their
own reports (app.services.external takes them). A run lives while they report; one silent for `lost_after` counts as
gone, and its verdict says so. A stop reaches only a script that reads `report.stop_requested()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from app.core.errors import FieldInvalid
from app.core.folders import RunFolders
from app.core.models import Run, RunStatus, utcnow
from app.core.settings import Settings
from app.launcher.interface import JobView, Launch, LaunchRefused, Requeue
from app.schemas.runs import RunCreate

# A rank may still be sending its last batches when another ends the run (a rank that raised fails it at once); a
# client retries every 5 s at most, so this is a dozen tries. After it, the tokens are refused like any ended run's.
LATE_BATCHES = timedelta(seconds=60)


class ExternalLauncher:
    """Watches, by their reports alone, the runs whose processes were started elsewhere."""

    name = "external"
    joins = True
    kills = False
    host_slots = False
    scheduler = ""
    waits_for = "its processes to join"
    stop_words = "the script stops at its next check"

    def __init__(self, settings: Settings) -> None:
        # A client posts every 2 s even when idle: this is minutes of silence.
        self.lost_after = timedelta(seconds=settings.external_lost_after_s)

    @staticmethod
    def ranks(run: Run) -> int:
        return run.world_size or 1  # what its job said when its processes joined

    @staticmethod
    def output_file(run: Run, folders: RunFolders) -> Path | None:
        return None  # where its job runs: Slurm's output file, torchrun's console

    @staticmethod
    def output_label(run: Run) -> str:
        return "launcher (kept where its job ran)"

    @staticmethod
    def job_script(run: Run, folders: RunFolders) -> Path | None:
        return None

    @staticmethod
    def takes_batch(run: Run, *, now: datetime) -> bool:
        """While it lives; once lost (its processes were only silent, and one that reports brings it back); for
        LATE_BATCHES after any other end."""
        if not run.status.is_final or run.status == RunStatus.lost:
            return True
        return run.finished_at is not None and now - run.finished_at <= LATE_BATCHES

    @staticmethod
    def stop_refusal(run: Run) -> str | None:
        if run.takes_stop:
            return None
        return (f"run {run.id} was launched elsewhere and its script does not take stop requests "
                "(report.init(..., takes_stop=True)); stop it where it was started")  # fmt: skip

    @staticmethod
    def resume_refusal(run: Run) -> str | None:
        return f"run {run.id} was launched elsewhere: start its job there again, and it rejoins"

    @staticmethod
    def rerun_refusal(run: Run) -> str | None:
        return f"run {run.id} ran elsewhere: rerun it there with TORCH_DISTRIBUTED_DEBUG=DETAIL"

    @staticmethod
    def sweep_refusal(run: Run) -> str | None:
        return "a scaling sweep runs on this host only, for now; this run was launched elsewhere"

    def check_fits(self, spec: RunCreate) -> None:
        raise FieldInvalid("launcher", "a run launched elsewhere is made by its processes joining it (report.init)")

    def places(self, run: Run, free: Sequence[int]) -> list[int] | None:
        return None  # its processes start where its job runs, never from this queue

    def world_size(self, run: Run) -> int:
        return self.ranks(run)

    def start(self, run: Run, *, token: str, devices: list[int]) -> Launch:
        raise LaunchRefused("a run launched elsewhere is started where it was launched")

    def scheduler_options(self, run: Run, *, groups: Sequence[str]) -> dict[str, str | int]:
        return {}  # never launched from here

    def refresh(self, runs: Sequence[Run]) -> None:
        """Nothing to gather: their reports came with their batches."""

    def observe(self, run: Run) -> JobView | None:
        return None

    def verdict(self, run: Run) -> tuple[RunStatus, str] | None:
        """Silent: lost, since only its reports said it lived (a report brings it back)."""
        silence = int((utcnow() - self._last_report(run)).total_seconds())
        reason = f"no process of the job has reported for {silence} s; it was launched elsewhere, so only its reports "
        return RunStatus.lost, reason + "say it lives"

    def requeue(self, run: Run) -> Requeue | None:
        return None  # its own scheduler requeues it, and its processes join again

    def exit_code(self, run: Run) -> int | None:
        return None  # each process says how it ended (services.external.ended), never as an exit code here

    def is_alive(self, run: Run) -> bool:
        """Whether one of its processes reported within `lost_after`."""
        return utcnow() - self._last_report(run) <= self.lost_after

    def terminate(self, run: Run) -> None:
        """Nothing to signal: the request rides on the reply to its processes' next batch."""

    def kill(self, run: Run) -> int:
        return 0  # no process of it is this server's to end

    def worker_failures(self, run: Run) -> list[str]:
        return []  # a rank that raised says so itself, and fails the run

    @staticmethod
    def _last_report(run: Run) -> datetime:
        return run.contact_at or run.started_at or run.created_at
