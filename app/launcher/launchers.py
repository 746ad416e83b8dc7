"""The launchers a server has: always this host's, and Slurm's where it can submit jobs."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.errors import FieldInvalid
from app.core.models import Run
from app.launcher.interface import Launcher
from app.launcher.local import LocalLauncher
from app.launcher.slurm import SlurmLauncher


@dataclass(frozen=True)
class Launchers:
    """This host's launcher, and the Slurm one when the settings and the host allow it."""

    local: LocalLauncher
    slurm: SlurmLauncher | None

    def for_run(self, run: Run) -> Launcher:
        """The launcher that runs `run`; a Slurm run on a server that lost Slurm is answered by a clear error."""
        if run.launcher == "slurm":
            return self.require_slurm()
        return self.local

    def require_slurm(self) -> SlurmLauncher:
        """The Slurm launcher; FieldInvalid naming `launcher` when this server has none."""
        if self.slurm is None:
            raise FieldInvalid("launcher", "this server cannot submit to Slurm: sbatch is not on its PATH, or "
                                           "RANKBOARD_LAUNCHER=local")  # fmt: skip
        return self.slurm

    def all(self) -> list[Launcher]:
        return [self.local, *([self.slurm] if self.slurm else [])]
