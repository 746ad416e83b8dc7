"""What Linux's /proc says about processes: are they the ones we started, and which belong to a run."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

PROC = Path("/proc")


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone or a zombie.

    A pid alone can be reused by another process; (pid, start time) names one process for good.
    """
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses; the fields after its last ')' are fixed.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def is_alive(pid: int, ticks: int | None) -> bool:
    """True when `pid` runs and is the process that started at `ticks`."""
    current = start_ticks(pid)
    return current is not None and (ticks is None or current == ticks)


def pids_with_env(name: str, value: str) -> list[int]:
    """Live processes whose environment has `name=value`: every process of one launch, orphans included.

    torchrun starts each worker in a session of its own, so a process group does not reach them all.
    """
    needle = f"{name}={value}".encode()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and start_ticks(int(entry.name)) is not None:
            found.append(int(entry.name))
    return found


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Sends `sig` to the process group led by `pid`, if it still exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
