"""A background thread that adds this process's ingest counts to the database's totals every FLUSH_S, and once
more as the server stops (app.services.ingest_totals)."""

from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import Session, sessionmaker

from app.services.ingest_totals import IngestTotals

log = logging.getLogger(__name__)
FLUSH_S = 1.0  # how stale another worker's counts may be in a scrape; one small write a second at most


class IngestTotalsWriter:
    def __init__(self, sessions: sessionmaker[Session], totals: IngestTotals) -> None:
        self.sessions, self.totals = sessions, totals
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rankboard-ingest-totals", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._flush()

    def _loop(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self._flush()

    def _flush(self) -> None:
        try:
            with self.sessions() as db:
                self.totals.add_to_database(db)
        except Exception:  # a busy database: the counts wait for the next flush, none is lost
            log.exception("adding ingest counts to the database failed; trying again")
