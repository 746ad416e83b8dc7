"""GET /metrics for Prometheus (only when RANKBOARD_PROMETHEUS is set: otherwise the route does not exist, a 404)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from app.services import exposition
from app.web.deps import IngestCountersDep, SessionDep

router = APIRouter(tags=["monitoring"])


@router.get("/metrics", response_class=Response, summary="Prometheus metrics (text exposition format)")
def metrics(db: SessionDep, counters: IngestCountersDep) -> Response:
    return Response(exposition.render(db, counters=counters), media_type=exposition.CONTENT_TYPE)
