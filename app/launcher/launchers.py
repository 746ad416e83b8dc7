"""The kinds of run there are, and the launchers a server has: always this host's and the one that watches runs
launched elsewhere, and Slurm's where it can submit jobs."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.core.errors import FieldInvalid
from app.core.models import Run
from app.launcher.external import ExternalLauncher
from app.launcher.interface import Launcher
from app.launcher.local import LocalLauncher
from app.launcher.slurm import SlurmLauncher

# Every kind of run by the name a run stores; a new kind is a new module and its line here.
KINDS: dict[str, type[Launcher]] = {kind.name: kind for kind in (LocalLauncher, SlurmLauncher, ExternalLauncher)}


def kind(name: str) -> type[Launcher]:
    """The kind of run a stored launcher name says: what the services and the pages ask of a run of it."""
    return KINDS[name]


def trains_builtin(run: Run) -> bool:
    """Whether the run trains a built-in workload (the trainer that declares its epochs and total, reports samples a
    second and keeps a goodput ledger), not a user's script nor a job launched elsewhere."""
    return run.script is None and not kind(run.launcher).joins


@dataclass(frozen=True)
class Launchers:
    """This host's launcher, the Slurm one when the settings and the host allow it, and the one of runs launched
    elsewhere (made from this host's settings)."""

    local: LocalLauncher
    slurm: SlurmLauncher | None
    external: ExternalLauncher = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "external", ExternalLauncher(self.local.settings))

    def all(self) -> list[Launcher]:
        """The launchers a new run may be made for: this host's, and Slurm's where there is one."""
        return [self.local, *([self.slurm] if self.slurm else [])]

    def watching(self) -> list[Launcher]:
        """Every launcher whose runs this server watches: those of `all`, and the one of runs launched elsewhere."""
        return [*self.all(), self.external]

    def named(self, name: str) -> Launcher | None:
        """The launcher of this name; None when this server has none of its kind (Slurm, on a server without it)."""
        return next((launcher for launcher in self.watching() if launcher.name == name), None)

    def for_run(self, run: Run) -> Launcher:
        """The launcher that runs `run`; one this server lacks is answered by an error naming `launcher`."""
        return self.require(run.launcher)

    def require(self, name: str) -> Launcher:
        """The launcher of this name; FieldInvalid naming `launcher` when this server has none."""
        launcher = self.named(name)
        if launcher is None:
            raise FieldInvalid("launcher", MISSING.get(name, f"this server has no launcher named {name!r}"))
        return launcher


# Why a server lacks a kind of launcher, in words that say how to get it.
MISSING = {
    SlurmLauncher.name: "this server cannot submit to Slurm: sbatch is not on its PATH, or RANKBOARD_LAUNCHER=local",
}
