"""Where each rank's time goes, for the dashboard's goodput: a ledger that is always in exactly one part.

`switch(part)` closes the part in progress and opens another, so the parts partition the process's life from its
creation to the last report with no gap and no overlap: what is not in any part cannot exist. Each rank reports its
own ledger every `wire.GOODPUT_REPORT_S` (and once at the end) through the metric client, under keys that name the
process incarnation (launch and torchrun restart), so a restarted worker's ledger never overwrites its predecessor's.
The server (app/services/goodput.py) lays the ledgers on the run's lifecycle to get the queue, restarts, repeated
steps, stalls and the stop. The cost is one `perf_counter()` per switch and one comparison per step.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from rankboard import report, wire


def process_start_unix() -> float:
    """When this process was created, in unix seconds (Linux: from /proc, to 10 ms); else now."""
    try:
        with open("/proc/self/stat") as file:
            # The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
            fields = file.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as file:
            uptime = float(file.read().split()[0])
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks
    except (OSError, IndexError, ValueError):
        return time.time()
    return time.time() - (uptime - started_after_boot)


def attempt_name(environ: os._Environ[str] | dict[str, str] = os.environ) -> str:
    """This incarnation's name: the launch id's first 8 characters and torchrun's restart count."""
    launch = "".join(c for c in environ.get(wire.ENV_LAUNCH_ID, "local") if c.isalnum())[:8] or "local"
    return f"{launch}.{int(environ.get('TORCHELASTIC_RESTART_COUNT', '0'))}"


class Ledger:
    """Seconds per part of this process's life so far; the part in progress counts up to now."""

    def __init__(self, start_unix: float | None = None, attempt: str | None = None) -> None:
        self.start_unix = process_start_unix() if start_unix is None else start_unix
        self.attempt = attempt_name() if attempt is None else attempt
        self.seconds = dict.fromkeys(wire.GOODPUT_PARTS, 0.0)
        self.part = "startup_launch"
        # perf_counter, not time(): a clock step must not move time between parts. Anchored to the process start.
        self._since = time.perf_counter() - max(0.0, time.time() - self.start_unix)
        self.first_step = self.step = 0
        self._reports = 0
        self._next_report = 0.0

    def switch(self, part: str) -> None:
        """Close the part in progress and open `part` now."""
        now = time.perf_counter()
        self.seconds[self.part] += now - self._since
        self.part, self._since = part, now

    @contextlib.contextmanager
    def within(self, part: str) -> Iterator[None]:
        """Count the block's time as `part`, then go back to the part it interrupted."""
        previous = self.part
        self.switch(part)
        try:
            yield
        finally:
            self.switch(previous)

    def totals(self) -> dict[str, float]:
        """Every part's seconds up to now, and the marks the server places them with (wire.GOODPUT_MARKS)."""
        self.switch(self.part)
        return {**self.seconds, "start": self.start_unix, "at": time.time(),
                "first_step": float(self.first_step), "step_reached": float(self.step)}  # fmt: skip

    def stepped(self, step: int) -> None:
        """Note a finished step; report the totals if the last report is GOODPUT_REPORT_S old."""
        self.step = step
        if time.perf_counter() >= self._next_report:
            self.report()

    def report(self) -> None:
        """Send the totals now, as report number n (the point's step) under this rank's own rank."""
        self._next_report = time.perf_counter() + wire.GOODPUT_REPORT_S
        self._reports += 1
        fields = self.totals()
        report.log({wire.GOODPUT_KEY.format(attempt=self.attempt, field=k): v for k, v in fields.items()},
                   step=self._reports)  # fmt: skip


# The process's ledger: made at import, so that the time before the trainer's entry point is the launch's.
LEDGER = Ledger()
