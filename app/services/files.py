"""Each rank's output, as torchrun writes it to the run's folder."""

from __future__ import annotations

from app.core.folders import RunFolders
from app.core.models import Run
from app.launcher.launchers import kind
from app.schemas.logs import RankOutput
from app.services import logs


def rank_outputs(run: Run, *, folders: RunFolders, lines: int = 20) -> list[RankOutput]:
    """The last `lines` lines of each rank's stdout and stderr, from torchrun's latest attempt."""
    outputs = []
    for file in logs.log_files(run, folders=folders):
        if file.rank is not None:
            try:
                outputs.append(RankOutput(rank=file.rank, stream=file.stream, lines=logs.tail(file.path, lines).lines))
            except FileNotFoundError:
                continue  # deleted since it was listed
    return outputs


def job_script(run: Run, *, folders: RunFolders) -> str | None:
    """The script a run was submitted with (a Slurm batch script), as written into its folder; None for other runs."""
    path = kind(run.launcher).job_script(run, folders)
    if path is None:
        return None
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return None


def checkpoint_failure(run: Run, *, folders: RunFolders) -> str | None:
    """The trainer's own words when a checkpoint could not be written (a full disk, a quota), if it said so."""
    for output in rank_outputs(run, folders=folders, lines=50):
        for line in reversed(output.lines):
            if " NOT written: " in line:
                return line.split("] ", 1)[-1]  # without the "[rank 0]" prefix
    return None
