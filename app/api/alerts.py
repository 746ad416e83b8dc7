"""Alerts: the rules and newest deliveries (admins), and each run's deliveries (viewers)."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter

from app.api import documented
from app.deps import SessionDep, SettingsDep
from app.errors import RunNotFound
from app.models import AlertDelivery
from app.params import RunId
from app.schemas import AlertDeliveryOut, AlertsOut
from app.services import alerts

router = APIRouter(tags=["alerts"])


@router.get("/api/alerts", response_model=AlertsOut, summary="Alert rules (admins) and the newest deliveries")
def alert_overview(db: SessionDep, settings: SettingsDep) -> AlertsOut:
    return alerts.overview(db, settings=settings)


@router.get("/api/runs/{run_id}/alerts", response_model=list[AlertDeliveryOut], responses=documented(RunNotFound),
            summary="A run's alert deliveries, newest first")  # fmt: skip
def run_alerts(run_id: RunId, db: SessionDep) -> Sequence[AlertDelivery]:
    return alerts.run_deliveries(db, run_id=run_id)
