"""This process's hold on a lease (app.store.leases): taken when free or expired, renewed by each use, released at
the end. `held` is judged on this process's own clock, from before the statement that renewed it, so it turns False
no later than the row expires: a process that stalls past its lease stops acting before another may start."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from app.core.models import utcnow
from app.store import leases

log = logging.getLogger(__name__)
SUPERVISOR = "supervisor"


def process_name() -> str:
    """Who holds a lease, as a person reads it: host, pid, and a nonce that a reused pid does not repeat."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Lease:
    def __init__(self, sessions: sessionmaker[Session], *, name: str, ttl_s: float, holder: str | None = None):
        self.sessions, self.name, self.ttl_s = sessions, name, ttl_s
        self.holder = holder or process_name()
        self._valid_until = 0.0  # time.monotonic() until which this process may act
        self._lock = threading.Lock()

    @property
    def held(self) -> bool:
        """Whether this process has the lease now, by its own clock (no database read)."""
        return time.monotonic() < self._valid_until

    def renew(self) -> bool:
        """Takes the lease, or keeps it for another ttl_s; False when another process has it."""
        started, now = time.monotonic(), utcnow()
        with self.sessions() as db, db.begin():
            took = leases.take(db, name=self.name, holder=self.holder, now=now,
                               until=now + timedelta(seconds=self.ttl_s))  # fmt: skip
        with self._lock:
            had = self.held
            self._valid_until = started + self.ttl_s if took else 0.0
        if took != had:
            log.info("%s %s the %s lease", self.holder, "took" if took else "lost", self.name)
        return took

    def release(self) -> None:
        """Frees the lease, if this process has it, for another process to take at once."""
        with self._lock:
            self._valid_until = 0.0
        with self.sessions() as db, db.begin():
            if leases.release(db, name=self.name, holder=self.holder):
                log.info("%s released the %s lease", self.holder, self.name)
