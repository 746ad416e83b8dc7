"""Leases: a job that exactly one server process may do, taken and renewed by one atomic statement."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.core.models import Lease


def take(db: Session, *, name: str, holder: str, now: datetime, until: datetime) -> bool:
    """Takes or renews the lease until `until`; True when `holder` has it now. One statement: an insert of the row
    that, where the row exists, updates it only if it is free, expired or already `holder`'s; two processes that
    try at once serialize on the row, and the second sees the first's holder and changes nothing (returns no row)."""
    dialect = postgresql if db.get_bind().dialect.name == "postgresql" else sqlite
    table = Lease.__table__
    statement = dialect.insert(table).values(name=name, holder=holder, expires_at=until)
    statement = statement.on_conflict_do_update(
        index_elements=[table.c.name],
        set_={"holder": holder, "expires_at": until},
        where=or_(table.c.holder == holder, table.c.holder.is_(None), table.c.expires_at < now),
    )
    # RETURNING, not rowcount: psycopg's driver answers -1 for an INSERT's rowcount, even one that changed a row.
    return db.execute(statement.returning(table.c.holder)).first() is not None


def release(db: Session, *, name: str, holder: str) -> bool:
    """Frees the lease if `holder` has it, so another process need not wait for it to expire."""
    result = db.execute(update(Lease).where(Lease.name == name, Lease.holder == holder).values(holder=None))
    return result.rowcount == 1  # type: ignore[attr-defined]


def holder_of(db: Session, *, name: str, now: datetime) -> str | None:
    """Who has the lease now; None when nobody does (never taken, released, or expired)."""
    lease = db.get(Lease, name, populate_existing=True)
    return lease.holder if lease is not None and lease.expires_at > now else None
