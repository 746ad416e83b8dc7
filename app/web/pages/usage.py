"""The Usage page: GPU-hours, energy, cost and goodput by user, tag or launcher over a period, and a chart by week."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.services import usage
from app.web.api.usage import By, From, To, utc
from app.web.deps import SessionDep, SettingsDep
from app.web.pages import page

router = APIRouter(include_in_schema=False)


@router.get("/usage", response_class=HTMLResponse)
def usage_page(
    request: Request, db: SessionDep, settings: SettingsDep, by: By = "user", start: From = None, end: To = None
) -> Response:
    """The table of the period's usage by `by`, the same as CSV one click away, and its weeks as a stacked chart."""
    report = usage.usage(db, by=by, start=utc(start), end=utc(end), prices=settings.gpu_prices)
    chart = usage.weekly_chart(report)
    return page(request, "usage.html", {"usage": report, "chart": chart, "query": request.url.query,
                                        "priced": bool(settings.gpu_prices),
                                        "to_value": end.date().isoformat() if end else ""})  # fmt: skip
