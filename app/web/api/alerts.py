"""Alerts: the rules and newest deliveries (admins), and each run's deliveries (viewers)."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter

from app.core.errors import RunNotFound
from app.core.models import AlertDelivery
from app.schemas.alerts import AlertDeliveryOut, AlertsOut
from app.services import alerts
from app.web.api import documented
from app.web.deps import SessionDep, SettingsDep
from app.web.params import RunId

router = APIRouter(tags=["alerts"])


@router.get("/api/alerts", response_model=AlertsOut, summary="Alert rules (admins) and the newest deliveries")
def alert_overview(db: SessionDep, settings: SettingsDep) -> AlertsOut:
    return alerts.overview(db, settings=settings)


@router.get("/api/runs/{run_id}/alerts", response_model=list[AlertDeliveryOut], responses=documented(RunNotFound),
            summary="A run's alert deliveries, newest first")  # fmt: skip
def run_alerts(run_id: RunId, db: SessionDep) -> Sequence[AlertDelivery]:
    return alerts.run_deliveries(db, run_id=run_id)
