"""Where each run's files live in the shared storage root: storage's business, whichever launcher runs the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rankboard import wire

from app.core.models import Run


@dataclass(frozen=True)
class RunFolders:
    """The run folders below the shared root: `logs/<run>/` (its output, markers, spools) and `checkpoints/<run>/`."""

    shared: Path

    def run_dir(self, run: Run) -> Path:
        """The run's own folder: the launcher's and the ranks' output, the trainer's markers and spools."""
        return self.shared / "logs" / run.folder

    def checkpoint_dir(self, run: Run) -> Path:
        """Where the run's trainer writes its checkpoints: a run launched elsewhere may name its own folder in the
        shared one (a link that leads out of it is not followed there)."""
        if run.checkpoint_folder:
            named = (self.shared / run.checkpoint_folder).resolve()
            if named.is_relative_to(self.shared.resolve()):
                return named
        return self.shared / "checkpoints" / run.folder

    def trainer_finished(self, run: Run) -> bool:
        """True when rank 0 wrote its completion marker: training ran to its end whatever the exit code says."""
        return (self.run_dir(run) / wire.FINISHED_MARKER).exists()
