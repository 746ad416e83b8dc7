"""The audit trail: who did what, and when."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.models import AuditEntry


def record(db: Session, *, actor: str, action: str, run_id: int | None = None, detail: str = "") -> None:
    """Adds an entry to the caller's transaction: it is kept only if what it tells of is."""
    db.add(AuditEntry(actor=actor, action=action, run_id=run_id, detail=detail))


def recent(db: Session, *, limit: int) -> Sequence[AuditEntry]:
    """The newest entries about users and tokens (those of no run)."""
    query = select(AuditEntry).where(AuditEntry.run_id.is_(None)).order_by(AuditEntry.id.desc()).limit(limit)
    return db.scalars(query).all()
