"""What a run leaves on shared storage: its checkpoints and each rank's output."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from app.launcher.local import LocalLauncher
from app.models import Run
from app.schemas import CheckpointOut

CHECKPOINT_NAME = re.compile(r"step-(\d+)\.pt")
TAIL_BYTES = 16_384


@dataclass(frozen=True)
class RankOutput:
    """The last lines one rank wrote to stdout or stderr."""

    rank: int
    stream: str
    lines: list[str]


def list_checkpoints(run: Run, *, launcher: LocalLauncher) -> list[CheckpointOut]:
    """The run's checkpoint files, oldest step first."""
    folder = launcher.checkpoint_dir(run)
    root = launcher.settings.shared
    found = []
    for entry in os.scandir(folder) if folder.is_dir() else []:
        match = CHECKPOINT_NAME.fullmatch(entry.name)
        if not match or not entry.is_file(follow_symlinks=False):
            continue  # temporary files of a write in progress, and links, are not checkpoints
        stat = entry.stat(follow_symlinks=False)
        found.append(CheckpointOut(
            name=entry.name, path=str(Path(entry.path).relative_to(root)), size=stat.st_size,
            modified=datetime.fromtimestamp(stat.st_mtime, timezone.utc), step=int(match.group(1)),
        ))  # fmt: skip
    return sorted(found, key=lambda c: c.step or 0)


def rank_outputs(run: Run, *, launcher: LocalLauncher, lines: int = 20) -> list[RankOutput]:
    """The last `lines` lines of each rank's stdout and stderr, from torchrun's latest attempt."""
    # torchrun --log-dir D --redirects 3 writes D/<rdzv id>_<random>/attempt_<n>/<local rank>/{stdout,stderr}.log
    attempts = sorted((launcher.run_dir(run) / "ranks").glob("*/attempt_*"), key=lambda p: (p.stat().st_mtime, p.name))
    if not attempts:
        return []
    outputs = []
    for rank_dir in sorted(attempts[-1].iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if rank_dir.name.isdigit():
            for stream in ("stdout", "stderr"):
                text = tail(rank_dir / f"{stream}.log", lines)
                outputs.append(RankOutput(int(rank_dir.name), stream, text))
    return outputs


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of a file, reading at most TAIL_BYTES from its end, never the whole file."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except FileNotFoundError:
        return []
    text = data.decode("utf-8", errors="replace").splitlines()
    if size > TAIL_BYTES:
        text = text[1:]  # the first line read is probably cut
    return text[-lines:]
