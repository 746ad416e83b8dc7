"""The Alerts page: the rules this server alerts by, and the newest deliveries (admins)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.services import alerts
from app.web.deps import SessionDep, SettingsDep
from app.web.pages import page

router = APIRouter(include_in_schema=False)


@router.get("/alerts", response_class=HTMLResponse)
def alerts_page(request: Request, db: SessionDep, settings: SettingsDep) -> Response:
    return page(request, "alerts.html", {"alerts": alerts.overview(db, settings=settings)})
