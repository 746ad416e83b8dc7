"""Login attempts rate-limited, per user name and per client address, in this process's memory.

With `rankboard serve --workers N` each worker counts the failures it saw, and a client's connections land on any
worker: a guesser gets up to N times `login_attempts` per window (the README says so where it describes --workers).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque


class LoginThrottle:
    """Counts failed logins in a sliding window; a key with `limit` failures in it waits until the oldest expires."""

    def __init__(self, *, limit: int, window_s: float) -> None:
        self.limit, self.window_s = limit, window_s
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()  # logins are sync routes: several threads at once

    def wait_s(self, *keys: tuple[str, int]) -> int:
        """Seconds until a login may be tried for these (key, limit factor) pairs; 0 when it may now."""
        now = time.monotonic()
        with self._lock:
            waits = [self._wait(key, self.limit * factor, now) for key, factor in keys]
        return max(waits, default=0)

    def failed(self, *keys: str) -> None:
        with self._lock:
            for key in keys:
                self._failures.setdefault(key, deque()).append(time.monotonic())

    def _wait(self, key: str, limit: int, now: float) -> int:
        failures = self._failures.get(key)
        if not failures:
            return 0
        while failures and now - failures[0] > self.window_s:
            failures.popleft()
        if len(failures) < limit:
            return 0
        return max(1, math.ceil(failures[-limit] + self.window_s - now))
