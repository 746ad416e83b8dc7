"""What every server process has ingested, together: one row that each process adds its own counts to."""

from __future__ import annotations

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.core.models import IngestTotal

ALL = "all"


def add(db: Session, *, batches: int, accepted: int, stored: int) -> None:
    """Adds counts to the totals, in one statement: processes adding at once each add theirs."""
    dialect = postgresql if db.get_bind().dialect.name == "postgresql" else sqlite
    table = IngestTotal.__table__
    statement = dialect.insert(table).values(name=ALL, batches=batches, accepted=accepted, stored=stored)
    db.execute(statement.on_conflict_do_update(index_elements=[table.c.name], set_={
        "batches": table.c.batches + statement.excluded.batches,
        "accepted": table.c.accepted + statement.excluded.accepted,
        "stored": table.c.stored + statement.excluded.stored,
    }))  # fmt: skip


def read(db: Session) -> tuple[int, int, int]:
    """(batches, points accepted, points stored) by every process since the database was made."""
    total = db.get(IngestTotal, ALL, populate_existing=True)
    return (total.batches, total.accepted, total.stored) if total else (0, 0, 0)
