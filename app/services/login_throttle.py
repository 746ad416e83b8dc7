"""Login attempts rate-limited, per user name and per client address, counted in the database (by the SHA-256 of
each: a name of any length fits, and no one reads the names and addresses tried from it).

Every worker of `rankboard serve --workers N` reads and adds to the same failures, so a guesser whose connections land
on all of them still gets `login_attempts` per window, not N times that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app.auth.passwords import sha256
from app.core.models import utcnow
from app.store import users as user_store


class LoginThrottle:
    """Counts failed logins in a sliding window; a key with `limit` failures in it waits until the oldest expires."""

    def __init__(self, *, limit: int, window_s: float) -> None:
        self.limit, self.window = limit, timedelta(seconds=window_s)

    def wait_s(self, db: Session, *keys: tuple[str, int]) -> int:
        """Seconds until a login may be tried for these (key, limit factor) pairs; 0 when it may now."""
        now = utcnow()
        waits = [self._wait(db, key, self.limit * factor, now) for key, factor in keys]
        return max(waits, default=0)

    def failed(self, db: Session, keys: Sequence[str]) -> None:
        """Counts a failed login against each key, in the caller's transaction."""
        now = utcnow()
        user_store.add_login_failures(db, keys=[sha256(key) for key in keys], at=now, forget_before=now - self.window)

    def _wait(self, db: Session, key: str, limit: int, now: datetime) -> int:
        oldest = user_store.login_failure_at(db, key=sha256(key), since=now - self.window, nth=limit)
        if oldest is None:
            return 0
        return max(1, math.ceil((oldest + self.window - now).total_seconds()))
