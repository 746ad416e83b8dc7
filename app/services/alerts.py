"""Alerts: which conditions hold now (a run failed, lost, not progressing, its loss not finite, succeeded; the shared
disk nearly full), one alert per condition per run until it clears, and its deliveries queued for the webhooks that
asked for it.

The supervisor's tick calls `check` inside its own transaction: it only writes rows. Sending is the alert sender's
background thread, outside any transaction, so a slow or dead receiver never holds up a tick or a request.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from app.core.errors import RunNotFound
from app.core.models import Alert, AlertDelivery, Run, RunStatus
from app.core.settings import ALERT_CONDITIONS, Settings, Webhook
from app.schemas.alerts import AlertDeliveryOut, AlertsOut, WebhookOut
from app.services import gpu_health, health, storage
from app.store import alerts as alert_store
from app.store import health as health_store
from app.store import metrics as metric_store
from app.store import runs as run_store

# Signals that other work will add; the alerts page lists them as not yet available.
NOT_YET_AVAILABLE = ("straggler",)
BACKOFF_CAP_S = 60.0
# A final state is a condition of the run's latest launch: a resumed run that fails again is a new alert.
FINAL_CONDITIONS = {"failed": RunStatus.failed, "lost": RunStatus.lost, "succeeded": RunStatus.succeeded}
SERVER_WIDE = "disk_low"
# The runs whose GPUs' faults raise `gpu_fault`: a failed or lost run too, whose GPU may be why it ended.
GPU_WATCHED = (RunStatus.running, RunStatus.failed, RunStatus.lost)


@dataclass(frozen=True)
class AlertRules:
    """What the supervisor's tick needs to raise alerts: the webhooks, the disk threshold, where runs are seen."""

    webhooks: tuple[Webhook, ...]
    disk_free_percent: float
    shared: Path
    public_url: str

    @classmethod
    def from_settings(cls, settings: Settings) -> AlertRules:
        return cls(tuple(settings.alert_webhooks), settings.alert_disk_free_percent, settings.shared,
                   settings.trainer_url)  # fmt: skip

    @property
    def conditions(self) -> set[str]:
        return {event for webhook in self.webhooks for event in webhook.events}


def webhook_label(webhook: Webhook) -> str:
    """How a webhook is named in stored deliveries: its name, else its host and a short hash that tells two webhooks
    on one host (Slack's) apart without keeping the secret part of the URL."""
    digest = hashlib.sha256(str(webhook.url).encode()).hexdigest()[:8]
    return webhook.name or f"{webhook.host} ({digest})"


def check(db: Session, *, runs: Sequence[Run], rules: AlertRules, now: datetime) -> int:
    """Raises the alerts of conditions that began, clears those that ended; returns the deliveries queued."""
    wanted = rules.conditions
    holding: dict[tuple[int | None, str], str] = {
        (run.id, c): m for run in runs for c, m in _run_conditions(db, run, wanted=wanted).items() if c in wanted
    }
    if SERVER_WIDE in wanted and (message := _disk_low(rules)):
        holding[(None, SERVER_WIDE)] = message
    by_id = {run.id: run for run in runs}
    open_now: set[tuple[int | None, str]] = set()
    for alert in alert_store.open_alerts(db, run_ids=list(by_id)):
        key = (alert.run_id, alert.condition)
        run = by_id.get(alert.run_id) if alert.run_id is not None else None
        if alert.run_id is not None and run is None:
            continue  # a run not looked at on this tick: its alert stays as it is
        if key not in holding or _relaunched_since(run, alert):
            alert.cleared_at = now
        else:
            open_now.add(key)
    queued = 0
    for (run_id, condition), message in holding.items():
        if (run_id, condition) not in open_now:
            queued += _raise(db, run=by_id.get(run_id) if run_id else None, condition=condition, message=message,
                             rules=rules, now=now)  # fmt: skip
    return queued


def _run_conditions(db: Session, run: Run, *, wanted: set[str]) -> dict[str, str]:
    """The conditions that hold for this run now, each with the sentence an alert says."""
    found = {c: f"run {run.id} ({run.name}) {c}: {run.status_reason}"
             for c, status in FINAL_CONDITIONS.items() if run.status == status}  # fmt: skip
    if "gpu_fault" in wanted and run.status in GPU_WATCHED and (fault := _gpu_fault(db, run)):
        found["gpu_fault"] = fault
    if run.status != RunStatus.running:
        return found
    if "not_progressing" in wanted:  # what health.record noted on this tick, read back from its events
        prefixes = (health.NOT_PROGRESSING, health.PROGRESSING_AGAIN)
        last = health_store.last_event(db, run_id=run.id, prefixes=prefixes, since=run.started_at)
        if last is not None and last.reason.startswith(health.NOT_PROGRESSING):
            found["not_progressing"] = f"run {run.id} ({run.name}) is {last.reason}"
    if "non_finite_loss" in wanted:
        loss = metric_store.last_value(db, run_id=run.id, key="loss")
        if loss is not None and not math.isfinite(loss):
            found["non_finite_loss"] = f"run {run.id} ({run.name}) has a loss of {loss}"
    return found


def _gpu_fault(db: Session, run: Run) -> str | None:
    """The sentence of a GPU fault of the run's latest launch (an Xid, a double-bit ECC error, a row remap pending
    or failed, a hardware slowdown), the first of them, with how many more; None while its GPUs report none."""
    since = int(run.started_at.timestamp()) if run.started_at else None
    found = gpu_health.faults(db, run=run, since=since)
    if not found:
        return None
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"run {run.id} ({run.name}): {found[0].sentence}{more}"


def _relaunched_since(run: Run | None, alert: Alert) -> bool:
    return (run is not None and alert.condition in FINAL_CONDITIONS and run.started_at is not None
            and run.started_at > alert.raised_at)  # fmt: skip


def _disk_low(rules: AlertRules) -> str | None:
    try:
        usage = storage.disk_usage(rules.shared)
    except OSError:  # the shared folder unmounted: no alert of its space, and the supervisor's tick goes on
        return None
    free = 100 * usage.free / usage.total if usage.total else 100.0
    if free >= rules.disk_free_percent:
        return None
    return (f"the shared folder {rules.shared} has {free:.1f}% free ({usage.free / 2**30:.1f} GiB), below "
            f"{rules.disk_free_percent:g}%")  # fmt: skip


def _raise(db: Session, *, run: Run | None, condition: str, message: str, rules: AlertRules, now: datetime) -> int:
    alert = Alert(run_id=run.id if run else None, condition=condition, message=message, raised_at=now)
    db.add(alert)
    db.flush()
    webhooks = [webhook for webhook in rules.webhooks if condition in webhook.events]
    for webhook in webhooks:
        db.add(AlertDelivery(alert_id=alert.id, run_id=alert.run_id, condition=condition,
                             webhook=webhook_label(webhook), url_host=webhook.host, status=alert_store.PENDING,
                             body=body(webhook, alert=alert, run=run, public_url=rules.public_url), attempts=0,
                             last_error="", created_at=now, next_attempt_at=now))  # fmt: skip
    return len(webhooks)


def body(webhook: Webhook, *, alert: Alert, run: Run | None, public_url: str) -> str:
    """What is posted: Slack's `{"text": ...}`, or a generic JSON object with every field on its own."""
    link = f"{public_url}/runs/{run.id}" if run else f"{public_url}/files"
    if webhook.format == "slack":
        return json.dumps({"text": f"Rankboard: {slack_escaped(alert.message)} <{link}|open>"})
    return json.dumps({
        "source": "rankboard", "condition": alert.condition, "message": alert.message,
        "raised_at": alert.raised_at.isoformat(), "url": link,
        "run": None if run is None else {"id": run.id, "name": run.name, "status": run.status.value,
                                         "reason": run.status_reason, "step": run.step},
    })  # fmt: skip


def slack_escaped(text: str) -> str:
    """Text as Slack's mrkdwn reads it literally: its three control characters escaped (a run's name may hold them)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def backoff(attempts: int, *, first_s: float) -> timedelta:
    """The wait after `attempts` failed tries: first_s, doubled each time, at most BACKOFF_CAP_S."""
    return timedelta(seconds=min(first_s * 2 ** (attempts - 1), BACKOFF_CAP_S))


def record_attempt(db: Session, *, delivery_id: int, error: str | None, http_status: int | None, retry: bool,
                   settings: Settings, now: datetime) -> None:  # fmt: skip
    """Keeps how one try went: sent; or pending again after a back-off; or failed after the last try."""
    with db.begin():
        delivery = db.get(AlertDelivery, delivery_id)
        if delivery is None:
            return  # its run was deleted meanwhile
        delivery.attempts += 1
        delivery.http_status = http_status
        if error is None:
            delivery.status, delivery.finished_at, delivery.last_error = alert_store.SENT, now, ""
            return
        delivery.last_error = error[:1000]
        if retry and delivery.attempts < settings.alert_attempts:
            delivery.next_attempt_at = now + backoff(delivery.attempts, first_s=settings.alert_backoff_s)
        else:
            delivery.status, delivery.finished_at = alert_store.FAILED, now


def due(db: Session, *, now: datetime, limit: int = 20) -> list[tuple[int, str, str]]:
    """(id, webhook label, body) of the deliveries to try now."""
    with db.begin():
        return [(d.id, d.webhook, d.body) for d in alert_store.due_deliveries(db, now=now, limit=limit)]


def next_due(db: Session) -> datetime | None:
    with db.begin():
        return alert_store.next_due(db)


def forget_unconfigured(db: Session, *, settings: Settings, now: datetime) -> int:
    """At start: pending deliveries to webhooks since removed from the settings fail, saying so."""
    with db.begin():
        return alert_store.fail_undeliverable(db, webhooks=[webhook_label(w) for w in settings.alert_webhooks],
                                              now=now)  # fmt: skip


def run_deliveries(db: Session, *, run_id: int, limit: int = 50) -> Sequence[AlertDelivery]:
    """A run's deliveries, newest first (the run page and the API); raises RunNotFound."""
    if run_store.get_run(db, run_id) is None:
        raise RunNotFound(run_id)
    return alert_store.run_deliveries(db, run_id=run_id, limit=limit)


def overview(db: Session, *, settings: Settings, limit: int = 100) -> AlertsOut:
    """The rules as configured (never their URLs) and the newest deliveries: the alerts page and its API."""
    webhooks = [WebhookOut(name=webhook_label(w), host=w.host, format=w.format, events=list(w.events))
                for w in settings.alert_webhooks]  # fmt: skip
    deliveries = [AlertDeliveryOut.model_validate(d) for d in alert_store.recent_deliveries(db, limit=limit)]
    return AlertsOut(webhooks=webhooks, conditions=list(ALERT_CONDITIONS), not_yet_available=list(NOT_YET_AVAILABLE),
                     disk_free_percent=settings.alert_disk_free_percent, deliveries=deliveries)  # fmt: skip
