"""Ingest counts across server processes: each process counts what it takes in memory (IngestCounters) and adds it,
now and then, to one row of totals in the database, which /metrics reads; with `serve --workers N` a scrape reaches
one worker, and still counts what every worker took."""

from __future__ import annotations

import threading

from sqlalchemy.orm import Session

from app.services.metrics import IngestCounters
from app.store import ingest_totals as store


class IngestTotals(IngestCounters):
    """This process's ingest counters, which it also adds to the database's totals (`add_to_database`)."""

    def __init__(self) -> None:
        super().__init__()
        self._added = (0, 0, 0)  # what the database already has of this process's counts
        self._adding = threading.Lock()  # a scrape and the writer thread add at once: each delta once

    def add_to_database(self, db: Session) -> None:
        """Adds to the totals, in a transaction of its own, what this process took since it last did."""
        with self._adding:
            counts = (self.batches, self.accepted, self.stored)
            batches, accepted, stored = (now - before for now, before in zip(counts, self._added, strict=True))
            if not (batches or accepted or stored):
                return
            with db.begin():
                store.add(db, batches=batches, accepted=accepted, stored=stored)
            self._added = counts

    def read(self, db: Session) -> tuple[int, int, int]:
        """Every process's (batches, points accepted, points stored), this one's up to now."""
        self.add_to_database(db)
        with db.begin():
            return store.read(db)
