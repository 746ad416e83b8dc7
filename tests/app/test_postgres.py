"""The same schema and ingest on PostgreSQL, for when one SQLite file is outgrown (RANKBOARD_DATABASE_URL)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient

from app.db import make_engine
from app.main import create_app
from app.models import Base, Run, RunStatus
from app.services.runs import hash_token
from app.settings import Settings
from tests.app.conftest import TOKEN, batch, post, series
from tests.postgres import new_database, postgres_bin, postgres_server
from trainer import wire

pytestmark = pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL is not installed (scripts/test installs it)")


@pytest.fixture(scope="module")
def admin_dsn() -> Iterator[str]:
    with postgres_server() as dsn:
        yield dsn


@pytest.fixture
def pg_client(admin_dsn: str, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared",
                        database_url=new_database(admin_dsn), supervise_interval_s=3600, slots=2)  # fmt: skip
    with TestClient(create_app(settings)) as client:
        yield client


def test_migrations_build_the_models_schema_on_postgresql(pg_client: TestClient) -> None:
    url = pg_client.app.state.settings.sqlalchemy_url  # type: ignore[attr-defined]
    with make_engine(url).connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []


def test_ingest_is_idempotent_and_keeps_nan_and_inf_on_postgresql(pg_client: TestClient) -> None:
    run_id = pg_client.post("/api/runs", json={"name": "pg"}).json()["id"]
    with pg_client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.token_hash = RunStatus.running, hash_token(TOKEN)
    assert post(pg_client, run_id, batch(1, 2, 3)).json() == {"accepted": 3, "stored": 3}
    assert post(pg_client, run_id, batch(3, 4)).json() == {"accepted": 2, "stored": 1}
    special = wire.Batch((wire.Point("loss", 5, math.nan), wire.Point("loss", 6, -math.inf))).to_json()
    post(pg_client, run_id, special)
    values = series(pg_client, run_id)
    assert [s for s, _, _ in values] == [1, 2, 3, 4, 5, 6]
    assert math.isnan(values[4][2]) and values[5][2] == -math.inf
    assert pg_client.get("/api/runs", params={"status": "running"}).json()["total"] == 1


def test_ids_and_steps_past_postgresqls_integer_columns_are_refused_not_500(pg_client: TestClient) -> None:
    """PostgreSQL's INTEGER columns hold 32 bits (SQLite's 64): the bounds at the edge are theirs."""
    run_id = pg_client.post("/api/runs", json={"name": "bounds"}).json()["id"]
    with pg_client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.token_hash = RunStatus.running, hash_token(TOKEN)
    top = 2**31 - 1  # wire.MAX_STEP
    assert pg_client.get(f"/api/runs/{top}").status_code == 404
    assert pg_client.get(f"/api/runs/{top + 1}").json()["detail"][0]["loc"] == ["path", "run_id"]
    assert post(pg_client, run_id, batch(top)).status_code == 200
    progress = {"epoch": top, "epochs": top, "step": top, "total_steps": top}
    assert post(pg_client, run_id, {"points": [], "progress": progress}).status_code == 200
    assert post(pg_client, run_id, batch(top + 1)).status_code == 422
    page = pg_client.get(f"/api/runs/{run_id}/metrics/loss", params={"start_step": top, "end_step": top}).json()
    assert [p["step"] for p in page["points"]] == [top]
    assert pg_client.get(f"/api/runs/{run_id}/metrics/loss", params={"start_step": top + 1}).status_code == 422
