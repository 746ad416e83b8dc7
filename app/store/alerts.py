"""Alerts (episodes of a condition) and their deliveries to webhooks."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from app.core.models import Alert, AlertDelivery

PENDING, SENT, FAILED = "pending", "sent", "failed"


def open_alerts(db: Session, *, run_ids: Sequence[int]) -> list[Alert]:
    """The alerts not yet cleared of these runs, and the server's own (run_id None)."""
    query = select(Alert).where(Alert.cleared_at.is_(None), or_(Alert.run_id.in_(run_ids), Alert.run_id.is_(None)))
    return list(db.scalars(query.order_by(Alert.id)))


def due_deliveries(db: Session, *, now: datetime, limit: int) -> Sequence[AlertDelivery]:
    """Pending deliveries whose next attempt is due, oldest first."""
    query = select(AlertDelivery).where(AlertDelivery.status == PENDING, AlertDelivery.next_attempt_at <= now)
    return db.scalars(query.order_by(AlertDelivery.next_attempt_at, AlertDelivery.id).limit(limit)).all()


def next_due(db: Session) -> datetime | None:
    """When the earliest pending delivery is due; None when nothing is pending."""
    query = select(AlertDelivery.next_attempt_at).where(AlertDelivery.status == PENDING)
    return db.scalars(query.order_by(AlertDelivery.next_attempt_at).limit(1)).first()


def run_deliveries(db: Session, *, run_id: int, limit: int) -> Sequence[AlertDelivery]:
    """A run's deliveries, newest first."""
    query = select(AlertDelivery).where(AlertDelivery.run_id == run_id)
    return db.scalars(query.order_by(AlertDelivery.id.desc()).limit(limit)).all()


def recent_deliveries(db: Session, *, limit: int) -> Sequence[AlertDelivery]:
    """Every run's and the server's deliveries, newest first."""
    return db.scalars(select(AlertDelivery).order_by(AlertDelivery.id.desc()).limit(limit)).all()


def fail_undeliverable(db: Session, *, webhooks: Sequence[str], now: datetime) -> int:
    """Marks failed the pending deliveries to webhooks no longer configured; returns how many."""
    query = (
        update(AlertDelivery)
        .where(AlertDelivery.status == PENDING, AlertDelivery.webhook.not_in(list(webhooks)))
        .values(status=FAILED, finished_at=now, last_error="the webhook is no longer configured")
    )
    return int(db.execute(query).rowcount or 0)  # type: ignore[attr-defined]
