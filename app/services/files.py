"""Each rank's output, as torchrun writes it to the run's folder."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from app.launcher.local import LocalLauncher
from app.models import Run

TAIL_BYTES = 16_384


@dataclass(frozen=True)
class RankOutput:
    """The last lines one rank wrote to stdout or stderr."""

    rank: int
    stream: str
    lines: list[str]


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


def checkpoint_failure(run: Run, *, launcher: LocalLauncher) -> str | None:
    """The trainer's own words when a checkpoint could not be written (a full disk, a quota), if it said so."""
    for output in rank_outputs(run, launcher=launcher, lines=50):
        for line in reversed(output.lines):
            if " NOT written: " in line:
                return line.split("] ", 1)[-1]  # without the "[rank 0]" prefix
    return None
