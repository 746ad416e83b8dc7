"""What psutil says about processes: are they the ones we started, and which belong to a run."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)  # exited; only the parent has not reaped it yet


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone or a zombie.

    A pid alone can be reused by another process; (pid, start time) names one process for good.
    """
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            if process.status() in GONE:
                return None
            started = process.create_time()
        boot = psutil.boot_time()
    except psutil.Error:
        return None
    # psutil adds the boot time to the kernel's ticks since boot, and that sum moves when the clock is set (NTP): the
    # ticks alone do not, and are what a run stored before holds (Run.pid_start_ticks), so the ticks are kept.
    return round((started - boot) * CLOCK_TICKS)


def is_alive(pid: int, ticks: int | None) -> bool:
    """True when `pid` runs and is the process that started at `ticks`."""
    current = start_ticks(pid)
    return current is not None and (ticks is None or current == ticks)


def pids_with_env(name: str, value: str) -> list[int]:
    """Live processes whose environment has `name=value`: every process of one launch, orphans included.

    torchrun starts each worker in a session of its own, so a process group does not reach them all.
    """
    found = []
    for process in psutil.process_iter(["environ"]):  # another user's environment reads as None
        environ = process.info["environ"] or {}
        if environ.get(name) == value and start_ticks(process.pid) is not None:
            found.append(process.pid)
    return found


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Sends `sig` to the process group led by `pid`, if it still exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
