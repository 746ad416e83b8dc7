"""A background thread that posts queued alerts to their webhooks, one try at a time, outside any transaction.

Each try is bounded: connecting, sending, and reading the status line and headers each wait at most
alert_timeout_s (the body is never read). A redirect is refused, never followed, so a webhook cannot send the alert on
to a host the admin did not name; proxies in the environment are not used. What each try gave is kept on its
delivery (app.services.alerts.record_attempt), so a restarted server goes on with what was still pending. Of several
server processes, only the supervisor's lease holder sends (given its lease), so no alert goes out twice.
"""

from __future__ import annotations

import http.client
import logging
import threading
from urllib.parse import urlsplit

from sqlalchemy.orm import Session, sessionmaker

from app.core.models import utcnow
from app.core.settings import Settings, Webhook
from app.services import alerts
from app.workers.lease import Lease

log = logging.getLogger(__name__)
POLL_S = 1.0  # how often pending retries are looked for when no tick wakes the thread
RETRIED_STATUSES = frozenset({408, 425, 429})  # and every 5xx: the receiver may answer later


class AlertSender:
    def __init__(self, sessions: sessionmaker[Session], settings: Settings, *, lease: Lease | None = None) -> None:
        self.sessions, self.settings, self.lease = sessions, settings, lease
        self.webhooks: dict[str, Webhook] = {alerts.webhook_label(w): w for w in settings.alert_webhooks}
        self._stop, self._wake = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rankboard-alerts", daemon=True)

    def start(self) -> None:
        with self.sessions() as db:
            alerts.forget_unconfigured(db, settings=self.settings, now=utcnow())
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=self.settings.alert_timeout_s * 2 + 5)

    def wake(self) -> None:
        """Called after each supervisor tick has committed: new alerts go out now rather than on the next poll."""
        self._wake.set()

    def send_due(self) -> int:
        """Tries each delivery that is due once; returns how many were tried."""
        with self.sessions() as db:
            due = alerts.due(db, now=utcnow())
        for delivery_id, label, body in due:
            if self._stop.is_set() or not self.may_send:
                break
            error, status, retry = self._post(label, body)
            with self.sessions() as db:
                alerts.record_attempt(db, delivery_id=delivery_id, error=error, http_status=status, retry=retry,
                                      settings=self.settings, now=utcnow())  # fmt: skip
        return len(due)

    @property
    def may_send(self) -> bool:
        """Whether this process sends: it holds the supervisor's lease, or it was given none (one process)."""
        return self.lease is None or self.lease.held

    def _post(self, label: str, body: str) -> tuple[str | None, int | None, bool]:
        webhook = self.webhooks.get(label)
        if webhook is None:
            return "the webhook is no longer configured", None, False
        try:
            return post(str(webhook.url), body, timeout=self.settings.alert_timeout_s)
        except (OSError, http.client.HTTPException) as error:
            return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__, None, True

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.may_send:
                    self.send_due()
            except Exception:  # a locked database: try again on the next wake
                log.exception("sending alerts failed; trying again")
            self._wake.wait(POLL_S)
            self._wake.clear()


def post(url: str, body: str, *, timeout: float) -> tuple[str | None, int | None, bool]:
    """POSTs a JSON body; (error or None, HTTP status, whether a retry may help)."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname or "", parts.port, timeout=timeout)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request("POST", target, body=body.encode(), headers={
            "Content-Type": "application/json", "User-Agent": "rankboard-alerts"})  # fmt: skip
        response = connection.getresponse()  # the status is all we need: its body is never read
    finally:
        connection.close()
    status = response.status
    if 200 <= status < 300:
        return None, status, False
    if 300 <= status < 400:
        where = urlsplit(response.getheader("Location") or "").hostname or "?"
        return f"HTTP {status}: a redirect (to {where}) is not followed", status, False
    return f"HTTP {status} {response.reason}", status, status >= 500 or status in RETRIED_STATUSES
