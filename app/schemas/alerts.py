"""Alert rules' deliveries and webhooks."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)


class AlertDeliveryOut(BaseModel):
    """One alert sent (or being sent) to one webhook."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    run_id: int | None = Field(description="None: an alert of the server's own (the shared disk).")
    condition: str
    webhook: str = Field(description="The rule's name, or its host and a short hash; never the URL.")
    url_host: str
    status: Literal["pending", "sent", "failed"]
    attempts: int
    last_error: str
    http_status: int | None
    created_at: datetime
    finished_at: datetime | None


class WebhookOut(BaseModel):
    name: str
    host: str
    format: Literal["json", "slack"]
    events: list[str]


class AlertsOut(BaseModel):
    """The alert rules (from the settings) and the newest deliveries."""

    webhooks: list[WebhookOut]
    conditions: list[str] = Field(description="What a rule may name.")
    not_yet_available: list[str] = Field(description="Conditions the server cannot tell yet.")
    disk_free_percent: float
    deliveries: list[AlertDeliveryOut]
