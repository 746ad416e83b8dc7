"""A background thread that ticks the runs' lifecycle: it finishes ended runs and starts queued ones.

It reads everything from the database and /proc on each tick, so a restarted server picks up the runs that
outlived it: still alive, they are watched again; ended, they are finished from their recorded exit code.

Of several server processes on one database (`rankboard serve --workers N`), only the one holding the supervisor's
lease ticks (and sends alerts); each tick renews it, and the others try to take it on each of theirs, so one takes
over within LEASE_TICKS ticks of the holder's death. A single process takes it at once.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from app.core.folders import RunFolders
from app.launcher.launchers import Launchers
from app.services.alerts import AlertRules
from app.services.lifecycle import tick
from app.workers.alert_sender import AlertSender
from app.workers.lease import SUPERVISOR as SUPERVISOR_LEASE
from app.workers.lease import Lease

log = logging.getLogger(__name__)
LEASE_TICKS = 10  # the lease outlives this many ticks: a slow tick (a busy database) must not hand it over
FIRST_PASS_WAIT_S = 30  # how long start() waits for the first tick: a slow one (a busy database) does not hold it


class Supervisor:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        launchers: Launchers,
        folders: RunFolders,
        *,
        interval: float,
        grace: float,
        stall_after: float,
        alert_rules: AlertRules | None = None,
        alert_sender: AlertSender | None = None,
        lease: Lease | None = None,
    ):
        self.sessions = sessions
        self.launchers = launchers
        self.folders = folders
        self.interval = interval
        self.grace = timedelta(seconds=grace)
        self.stall_after = timedelta(seconds=stall_after)
        self.alert_rules, self.alert_sender = alert_rules, alert_sender
        self.lease = lease or Lease(sessions, name=SUPERVISOR_LEASE, ttl_s=interval * LEASE_TICKS)
        self._stop, self._first_pass = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rankboard-supervisor", daemon=True)

    def start(self) -> None:
        """Starts ticking, and returns once the first tick has looked at the runs that outlived the last server (or
        FIRST_PASS_WAIT_S later): a request answered before it would see them as that server left them, and a run
        made meanwhile could be started under the request that made it."""
        if self.alert_sender is not None:
            self.alert_sender.start()
        self._thread.start()
        self._first_pass.wait(FIRST_PASS_WAIT_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.alert_sender is not None:
            self.alert_sender.stop()
        try:
            self.lease.release()  # another process supervises at once, not after the lease expires
        except Exception:  # a database already gone: the lease expires by itself
            log.exception("releasing the supervisor lease failed")

    def tick(self) -> None:
        with self.sessions() as db:
            tick.supervise(db, launchers=self.launchers, folders=self.folders, grace=self.grace,
                           stall_after=self.stall_after, alert_rules=self.alert_rules)  # fmt: skip
        if self.alert_sender is not None:
            self.alert_sender.wake()  # after the commit: what this tick raised is there to be sent

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.lease.renew():
                    self.tick()
            except Exception:  # one bad tick (a locked database, a full disk) must not end supervision
                log.exception("supervisor tick failed; trying again")
            self._first_pass.set()
            self._stop.wait(self.interval)
