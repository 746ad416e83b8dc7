"""The same schema and ingest on PostgreSQL, for when one SQLite file is outgrown (RANKBOARD_DATABASE_URL)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from rankboard import wire

from app.core.db import make_engine
from app.core.models import Base, Run, RunStatus
from app.core.settings import Settings
from app.main import create_app
from app.schemas.metrics import BatchIn
from app.services import metrics
from app.store import chunks
from app.store import metrics as metric_store
from tests.app import (
    test_charts,
    test_db,
    test_health,
    test_metrics_csv,
    test_point_chunks,
    test_queue,
    test_runs_table,
    test_supervisor,
    test_usage,
)
from tests.app.conftest import TOKEN, batch, post, ranks_at_each_step, read_all_pages, running_run, series
from tests.postgres import new_database, postgres_bin, postgres_server

pytestmark = pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL is not installed (scripts/test installs it)")


@pytest.fixture(scope="module")
def admin_dsn() -> Iterator[str]:
    with postgres_server() as dsn:
        yield dsn


def pg_settings(admin_dsn: str, tmp_path: Path, **more: Any) -> Settings:
    """A server's settings on a new database of the test server; the supervisor ticks once at start."""
    return Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared", database_url=new_database(admin_dsn),
                    supervise_interval_s=3600, **more)  # fmt: skip


@pytest.fixture
def pg_client(admin_dsn: str, tmp_path: Path) -> Iterator[TestClient]:
    settings = pg_settings(admin_dsn, tmp_path, slots=2)
    with TestClient(create_app(settings)) as client:
        yield client


def test_migrations_build_the_models_schema_on_postgresql(pg_client: TestClient) -> None:
    url = pg_client.app.state.settings.sqlalchemy_url  # type: ignore[attr-defined]
    with make_engine(url).connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []


def test_ingest_is_idempotent_and_keeps_nan_and_inf_on_postgresql(pg_client: TestClient) -> None:
    run_id = running_run(pg_client)
    assert post(pg_client, run_id, batch(1, 2, 3)).json() == {"accepted": 3, "stored": 3}
    assert post(pg_client, run_id, batch(3, 4)).json() == {"accepted": 2, "stored": 1}
    special = wire.Batch((wire.Point("loss", 5, math.nan), wire.Point("loss", 6, -math.inf))).to_json()
    post(pg_client, run_id, special)
    values = series(pg_client, run_id)
    assert [s for s, _, _ in values] == [1, 2, 3, 4, 5, 6]
    assert math.isnan(values[4][2]) and values[5][2] == -math.inf
    assert pg_client.get("/api/runs", params={"status": "running"}).json()["total"] == 1


def test_paging_a_series_of_several_ranks_per_step_ends_on_postgresql(pg_client: TestClient) -> None:
    run_id = running_run(pg_client)
    post(pg_client, run_id, ranks_at_each_step(range(1, 6), ranks=3))
    whole = [(step, rank) for step in range(1, 6) for rank in range(3)]
    for limit in (1, 2, 3, 4, 7):
        assert read_all_pages(pg_client, run_id, "rank/step_ms", limit=limit) == whole, limit


def test_steps_past_32_bits_are_stored_on_postgresql(pg_client: TestClient) -> None:
    """GPU samples are keyed by unix seconds (2**31 in 2038), and long runs count far: steps need 64 bits."""
    run_id = running_run(pg_client)
    far = 2**40
    body = wire.Batch(
        tuple(wire.Point("loss", far + i, 0.5) for i in range(20)),
        progress=wire.Progress(epoch=1, epochs=1, step=far, total_steps=far + 10),
        heartbeat=wire.Heartbeat(rank=0, host="node-a", step=far),
    ).to_json()
    assert post(pg_client, run_id, body).status_code == 200
    assert series(pg_client, run_id)[0] == (far, 0, 0.5)
    assert pg_client.get(f"/api/runs/{run_id}").json()["step"] == far + 19  # its highest training step
    chart = pg_client.get(f"/api/runs/{run_id}/chart", params={"key": "loss", "width": 2}).json()
    assert chart["ranks"]["0"]["step"][-1] == far + 19  # read from the tiers, whose buckets are past 2**31 too


def test_ids_and_steps_past_their_columns_are_refused_not_500(pg_client: TestClient) -> None:
    """Run ids and epochs are PostgreSQL INTEGERs (32 bits), steps BIGINTs: the bounds at the edge are theirs."""
    run_id = running_run(pg_client)
    top_id = 2**31 - 1
    assert pg_client.get(f"/api/runs/{top_id}").status_code == 404
    assert pg_client.get(f"/api/runs/{top_id + 1}").json()["detail"][0]["loc"] == ["path", "run_id"]
    top = wire.MAX_STEP
    assert post(pg_client, run_id, batch(top)).status_code == 200
    progress = {"epoch": wire.MAX_EPOCH, "epochs": wire.MAX_EPOCH, "step": top, "total_steps": top}
    assert post(pg_client, run_id, {"points": [], "progress": progress}).status_code == 200
    progress["epoch"] = wire.MAX_EPOCH + 1
    assert post(pg_client, run_id, {"points": [], "progress": progress}).status_code == 422
    assert post(pg_client, run_id, batch(top + 1)).status_code == 422
    page = pg_client.get(f"/api/runs/{run_id}/metrics/loss", params={"start_step": top, "end_step": top}).json()
    assert [p["step"] for p in page["points"]] == [top]
    assert pg_client.get(f"/api/runs/{run_id}/metrics/loss", params={"start_step": top + 1}).status_code == 422


def test_metrics_for_prometheus_read_the_newest_gpu_sample_on_postgresql(admin_dsn: str, tmp_path: Path) -> None:
    settings = pg_settings(admin_dsn, tmp_path, prometheus=True, slots=2)
    with TestClient(create_app(settings)) as client:
        run_id = running_run(client)
        key = wire.GPU_KEY.format(host="node-a", index=3, field="util")
        points = tuple(wire.Point(key, 1_790_000_000 + s, float(s), 0, 0.0) for s in range(5))
        assert post(client, run_id, wire.Batch(points).to_json()).status_code == 200
        scraped = {f.name: f.samples for f in text_string_to_metric_families(client.get("/metrics").text)}
    util = [(s.labels, s.value) for s in scraped["rankboard_gpu_utilization_ratio"]]
    assert util == [({"run_id": str(run_id), "host": "node-a", "gpu": "3"}, 0.04)]


def test_the_runs_table_filters_sorts_searches_and_deletes_on_postgresql(pg_client: TestClient) -> None:
    made = []
    for values in ([1.0, 0.2], [0.9, 0.6], [0.4, math.nan]):
        run_id = running_run(pg_client)
        points = tuple(wire.Point("loss", step, value) for step, value in enumerate(values, start=1))
        assert post(pg_client, run_id, wire.Batch(points).to_json()).status_code == 200
        made.append(run_id)
    a, b, c = made
    pg_client.patch(f"/api/runs/{b}", json={"tags": ["Keeper"]})
    view = {"filter": "loss.min < 0.7; lr >= 1e-4", "sort": "loss.last", "columns": "loss.last,loss.min,lr"}
    body = pg_client.get("/api/runs", params=view).json()
    assert [run["id"] for run in body["items"]] == [a, b, c]  # c's last value is NaN: it sorts last
    assert body["values"][str(c)] == {"loss.last": None, "loss.min": 0.4, "lr": 0.001}
    assert [run["id"] for run in pg_client.get("/api/runs", params={"q": "keeper"}).json()["items"]] == [b]
    with pg_client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, a).status = RunStatus.succeeded
    assert pg_client.delete(f"/api/runs/{a}").json()["points"] == 2
    assert [run["id"] for run in pg_client.get("/api/runs").json()["items"]] == [c, b]
    assert pg_client.get(f"/api/runs/{a}/metrics").status_code == 404


def test_every_kind_of_run_filters_and_sorts_on_its_config_keys_on_postgresql(pg_client: TestClient) -> None:
    test_runs_table.assert_config_keys_filter_and_sort(pg_client)


def test_a_populated_postgresql_store_moves_its_options_into_config_documents(admin_dsn: str, tmp_path: Path) -> None:
    test_db.assert_the_config_migration_keeps_every_run(new_database(admin_dsn), tmp_path, count=2500)


def test_a_populated_postgresql_store_gets_its_tiers_times(admin_dsn: str, tmp_path: Path) -> None:
    test_charts.assert_the_tier_times_migration_fills_every_bucket(new_database(admin_dsn), tmp_path)


def test_a_populated_postgresql_store_codes_its_samples_as_samples_in_place_and_back(
    admin_dsn: str, tmp_path: Path
) -> None:
    test_point_chunks.assert_samples_convert_in_place_and_back(new_database(admin_dsn), tmp_path)


def test_a_postgresql_store_from_before_run_costs_is_measured_after_the_upgrade_and_goes_back(
    admin_dsn: str, tmp_path: Path
) -> None:
    test_usage.assert_the_run_costs_migration_measures_old_runs_and_goes_back(new_database(admin_dsn), tmp_path)


def test_a_series_as_csv_holds_exactly_its_json_points_on_postgresql(pg_client: TestClient) -> None:
    test_metrics_csv.assert_csv_holds_the_json_points(pg_client, running_run(pg_client))


def test_batches_into_the_same_chunks_at_once_lose_nothing_on_postgresql(pg_client: TestClient) -> None:
    """Each batch reads a chunk and writes it back: two at once must not both start from the same chunk."""
    run_id = running_run(pg_client)
    sessions = pg_client.app.state.sessions  # type: ignore[attr-defined]

    def send(offset: int) -> None:
        for first in range(
            0, 2000, 100
        ):  # 4 threads interleave their steps: each batch lands in chunks the others write
            steps = range(first * 4 + offset, (first + 100) * 4, 4)
            body = wire.Batch(columns=(wire.Column("loss", 0, list(steps), [1.0] * 100, [1.7e9] * 100),)).to_json()
            with sessions() as db:
                metrics.ingest(db, run_id=run_id, token=TOKEN, batch=BatchIn.model_validate(body))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send, range(4)))
    assert [step for step, _rank in read_all_pages(pg_client, run_id, "loss", limit=10_000)] == list(range(8000))
    with sessions() as db:
        logged = metric_store.points_after(db, run_id=run_id, after_id=0, limit=100_000)
    assert sorted(point.step for point in logged) == list(range(8000))
    assert [point.id for point in logged] == list(range(1, 8001))  # numbered in commit order, each once


def test_rows_of_mixed_number_types_are_written_from_arrays_on_postgresql(pg_client: TestClient) -> None:
    """Rows go to PostgreSQL as one binary array a column (app.core.pg_arrays): a float column that holds ints and
    numpy's numbers, an integer one of numpy's, and either with a NULL, are stored as given, not refused."""
    sessions = pg_client.app.state.sessions  # type: ignore[attr-defined]
    rows = [
        (1, np.int64(7), 2, np.float64(0.5), b"a"),
        (np.int32(2), 3_000_000_000, 4, None, b"\\x00"),
        (3, None, np.int64(5), 1, None),
    ]
    with sessions() as db, db.begin():
        connection = db.connection()
        connection.exec_driver_sql("CREATE TEMPORARY TABLE t (a integer, b bigint, c float8, d float8, e bytea)")
        chunks.insert_many(connection, "INSERT INTO t (a, b, c, d, e) {rows}",
                           ("integer", "bigint", "float8", "float8", "bytea"), rows, key=1)  # fmt: skip
        stored = connection.exec_driver_sql("SELECT a, b, c, d, e FROM t ORDER BY a").all()
    assert [tuple(row) for row in stored] == [
        (1, 7, 2.0, 0.5, b"a"),
        (2, 3_000_000_000, 4.0, None, b"\\x00"),
        (3, None, 5.0, 1.0, None),
    ]


# The supervisor's statements are built once and take their values at each tick (a LIMIT, an IN of statuses, a time):
# the same tests on PostgreSQL, each on a database of its own (a tick would start the other test's queued runs).
def test_a_tick_reads_the_same_live_and_queued_runs_on_postgresql(pg_client: TestClient) -> None:
    test_supervisor.test_a_tick_reads_the_live_runs_as_objects_and_this_hosts_queue_only_as_rows(pg_client)


def test_the_supervisor_records_not_progressing_and_progressing_again_on_postgresql(pg_client: TestClient) -> None:
    test_health.test_the_supervisor_records_not_progressing_once_and_progressing_again_once(pg_client)


def test_fair_share_sums_each_owners_slot_hours_on_postgresql(pg_client: TestClient) -> None:
    test_queue.usage_within_a_day(pg_client.app.state.sessions)  # type: ignore[attr-defined]


def test_postgresql_chunks_with_appended_records_are_packed_whole_going_back_a_revision(
    admin_dsn: str, tmp_path: Path
) -> None:
    test_point_chunks.assert_tails_are_packed_whole_going_back(pg_settings(admin_dsn, tmp_path))


def test_postgresql_live_log_keeps_every_point_and_its_number_going_back_a_revision_and_forward(
    admin_dsn: str, tmp_path: Path
) -> None:
    test_point_chunks.assert_the_live_log_keeps_every_point_and_its_number_both_ways(pg_settings(admin_dsn, tmp_path))
