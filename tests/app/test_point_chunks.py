"""Points packed in chunks: an old store of one row per point converts in place with every point intact and the same
charts, and back; the live pages' log of new points keeps only the newest."""

from __future__ import annotations

import math
import random
from pathlib import Path

from alembic.command import downgrade, upgrade
from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import text
from sqlalchemy.orm import Session

from app.core.db import alembic_config, make_engine
from app.core.settings import Settings
from app.main import create_app
from app.store import metrics as metric_store
from tests.app.conftest import post
from tests.app.test_charts import assert_exact, same

BEFORE = "0013_goodput"
# (key, step, rank) -> (value, time). NaN was stored as NULL in the point table.
Stored = dict[tuple[str, int, int], tuple[float, float]]


def old_points(rng: random.Random) -> Stored:
    """Two ranks of a dense loss (more than the migration's page: it ends inside a chunk), NaN and infinities in it;
    GPU samples at unix seconds; an eval every 500 steps."""
    points: Stored = {}
    for step in range(60_000):
        for rank in (0, 1):
            value = rng.choice([math.nan, math.inf, -math.inf]) if rng.random() < 0.01 else rng.gauss()
            points["loss", step, rank] = (value, 1_763_000_000 + step * 0.0371 + rank * 1e-7)
    for i in range(3000):
        points["gpu/node1/0/util", 1_763_000_000 + 2 * i, 0] = (float(i % 101), 1_763_000_000.5 + 2 * i)
    for step in range(0, 60_000, 500):
        points["val_loss", step, 0] = (1 / (step + 1), 1_763_000_000 + step)
    return points


def series_points(client: TestClient, run_id: int, key: str) -> Stored:
    """Every point of a series, through the API's paging."""
    found: Stored = {}
    cursor: dict[str, int] = {"start_step": 0, "start_rank": 0}
    while True:
        page = client.get(f"/api/runs/{run_id}/metrics/{key}", params={**cursor, "limit": 7000}).json()
        for point in page["points"]:
            found[key, point["step"], point["rank"]] = (wire.decode_value(point["value"]), point["time"])
        if page["next_step"] is None:
            return found
        cursor = {"start_step": page["next_step"], "start_rank": page["next_rank"]}


def assert_same(got: Stored, want: Stored) -> None:
    assert got.keys() == want.keys()
    for key, (value, time) in want.items():
        assert same(got[key][0], value) and got[key][1] == time, key


def test_an_old_store_converts_in_place_with_every_point_and_chart_the_same(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(alembic_config(url), BEFORE)
    points = old_points(random.Random(5))
    engine = make_engine(url)
    with Session(engine) as db, db.begin():
        # In SQL, as the store was then: today's Run keeps its options in a config document (0017), this one's columns.
        run_id = db.execute(text(
            "INSERT INTO runs (name, status, status_reason, created_at, workload, nproc_per_node, epochs, batch_size,"
            " lr, checkpoint_every, seed, epoch, step, total_steps, samples_per_s, trainer_finished)"
            " VALUES ('old', 'succeeded', '', '2026-01-01 00:00:00', 'mlp', 2, 1, 1, 0.1, 1, 0, 0, 0, 0, 0, 0)"
        )).lastrowid  # fmt: skip
        ids = metric_store.series_ids(db, run_id=run_id, keys={key for key, _, _ in points})
        rows = [{"series_id": ids[key], "step": step, "rank": rank, "value": None if math.isnan(v) else v, "time": t}
                for (key, step, rank), (v, t) in points.items()]  # fmt: skip
        db.execute(text("INSERT INTO metric_points (series_id, step, rank, value, time)"
                        " VALUES (:series_id, :step, :rank, :value, :time)"), rows)  # fmt: skip
        newest = db.scalar(text("SELECT MAX(id) FROM metric_points"))
    engine.dispose()

    upgrade(alembic_config(url), "head")
    settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared", database_url=url,
                        supervise_interval_s=3600)  # fmt: skip
    with TestClient(create_app(settings)) as client:
        for key in ("loss", "gpu/node1/0/util", "val_loss"):
            want = {k: v for k, v in points.items() if k[0] == key}
            assert_same(series_points(client, run_id, key), want)
            by_step = {(step, rank): value for (_, step, rank), (value, _) in want.items()}
            times = {(step, rank): time for (_, step, rank), (_, time) in want.items()}  # the tiers' times: 0018
            for params in ({"width": 1000}, {"width": 7}, {"width": 300, "start_step": 30_100, "end_step": 41_000}):
                chart = client.get(f"/api/runs/{run_id}/chart", params={"key": key, **params}).json()
                assert_exact(chart, by_step, width=params["width"], times=times)
        summary = client.get("/api/runs", params={"columns": "loss.last,loss.min"}).json()["values"][str(run_id)]
        assert same(summary["loss.last"], points["loss", 59_999, 0][0])
        # A page open across the upgrade continues from its cursor, the old point table's last id.
        assert client.get("/api/runs").status_code == 200
        with client.app.state.sessions() as db:  # type: ignore[attr-defined]
            assert metric_store.last_point_id(db) == newest

    downgrade(alembic_config(url), BEFORE)
    with make_engine(url).connect() as connection:
        rows = connection.execute(text("SELECT s.key, p.step, p.rank, p.value, p.time FROM metric_points p"
                                       " JOIN metric_series s ON s.id = p.series_id")).all()  # fmt: skip
    back = {(key, step, rank): (math.nan if value is None else value, time) for key, step, rank, value, time in rows}
    assert_same(back, points)


def test_the_log_for_live_pages_keeps_the_newest_points_each_once(client: TestClient, run_id: int, monkeypatch) -> None:
    monkeypatch.setattr(metric_store, "RECENT_POINTS", 500)
    for first in range(0, 2000, 100):
        batch = wire.Batch(tuple(wire.Point("loss", step, float(step)) for step in range(first, first + 100)))
        assert post(client, run_id, batch.to_json()).status_code == 200
    post(client, run_id, wire.Batch((wire.Point("loss", 5, 9.0),)).to_json())  # a re-sent point is not new
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        newest = metric_store.points_after(db, run_id=run_id, after_id=0, limit=10_000)
        assert [point.step for point in newest] == list(range(1500, 2000))
        assert [point.id for point in newest] == list(range(1501, 2001))
        count = db.scalar(text("SELECT SUM(n) FROM metric_recent"))
        assert count == 500
        page = metric_store.points_after(db, run_id=run_id, after_id=1700, limit=50)
        assert [point.id for point in page][:50] == list(range(1701, 1751))
