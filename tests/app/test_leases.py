"""The supervisor's lease (app.store.leases, app.workers.lease): one holder at a time, taken over once it expires or
is released, taken by exactly one of many at once; on SQLite and on PostgreSQL. Of two servers on one database, only
the holder supervises and sends alerts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import make_engine, make_sessionmaker, prepare_schema
from app.core.models import utcnow
from app.core.settings import Settings
from app.main import create_app
from app.store import leases
from app.workers.lease import SUPERVISOR, Lease
from tests.app.test_alerts import Receiver
from tests.live import wait_for
from tests.postgres import new_database, postgres_bin, postgres_server

TTL_S = 0.5


@pytest.fixture(scope="module")
def admin_dsn() -> Iterator[str]:
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (scripts/test installs it)")
    with postgres_server() as dsn:
        yield dsn


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'rankboard.db'}"
    else:
        url = new_database(request.getfixturevalue("admin_dsn"))
    engine = make_engine(url)
    prepare_schema(engine, url)
    yield make_sessionmaker(engine)
    engine.dispose()


def holder(sessions: sessionmaker[Session]) -> str | None:
    with sessions() as db:
        return leases.holder_of(db, name=SUPERVISOR, now=utcnow())


def test_one_process_holds_it_until_it_expires_then_another_takes_it(sessions: sessionmaker[Session]) -> None:
    first, second = (Lease(sessions, name=SUPERVISOR, ttl_s=TTL_S, holder=name) for name in ("first", "second"))
    assert first.renew() and first.held
    assert not second.renew() and not second.held
    assert first.renew(), "its holder renews it"
    assert holder(sessions) == "first"
    time.sleep(TTL_S * 1.5)  # the first stops renewing: as a process that died, or stalled
    assert not first.held, "by its own clock, the first knows it may no longer act"
    assert holder(sessions) is None
    assert second.renew() and second.held
    assert not first.renew() and not first.held, "the first, come back, finds it taken"
    assert holder(sessions) == "second"


def test_a_released_lease_is_taken_at_once(sessions: sessionmaker[Session]) -> None:
    first, second = (Lease(sessions, name=SUPERVISOR, ttl_s=3600, holder=name) for name in ("first", "second"))
    assert first.renew()
    first.release()
    assert not first.held and holder(sessions) is None
    assert second.renew()
    first.release()  # not its holder any more: changes nothing
    assert holder(sessions) == "second"


def test_of_many_processes_trying_at_once_exactly_one_takes_it(sessions: sessionmaker[Session]) -> None:
    contenders = [Lease(sessions, name=SUPERVISOR, ttl_s=3600, holder=f"p{i}") for i in range(8)]
    start, took = threading.Barrier(len(contenders)), []

    def contend(lease: Lease) -> None:
        start.wait()
        if lease.renew():
            took.append(lease.holder)

    threads = [threading.Thread(target=contend, args=(lease,)) for lease in contenders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(took) == 1
    assert holder(sessions) == took[0]


def test_of_two_servers_on_one_database_only_the_holder_supervises_and_sends_an_alert_once(tmp_path: Path) -> None:
    receiver = Receiver()
    hooks = [{"url": f"{receiver.url}/hook", "events": ["disk_low"]}]  # below 100% free: low from the first tick

    def server() -> TestClient:
        return TestClient(create_app(Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared",
                                              alert_webhooks=hooks, alert_disk_free_percent=100,
                                              supervise_interval_s=0.2)))  # fmt: skip

    try:
        with server() as first, server() as second:
            wait_for(lambda: receiver.got, timeout=30, what="the alert")
            time.sleep(2)  # ten ticks of each: a second sender, or a second supervisor, would have sent it again
            held = [client.app.state.supervisor.lease.held for client in (first, second)]  # type: ignore[attr-defined]
    finally:
        receiver.close()
    assert sorted(held) == [False, True]
    assert [path for path, _ in receiver.got] == ["/hook"]
