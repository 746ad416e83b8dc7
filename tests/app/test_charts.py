"""The chart endpoint: at most `width` buckets per rank, each one's min, max, last and its time exact, computed by the
database.

The expected answers are computed here by brute force from the points the test sent; the points go in through the
real ingest API, shuffled into batches of random sizes, some of them sent twice, so the pre-aggregated tiers are
built the way a trainer's retries and replays build them.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from alembic.command import downgrade
from alembic.command import upgrade as upgrade_to
from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import inspect, text
from sqlalchemy.orm import Session

from app.auth.passwords import sha256 as hash_token
from app.core.db import alembic_config, make_engine, upgrade
from app.core.models import Run, RunStatus
from app.core.settings import Settings
from app.main import create_app
from app.schemas.metrics import ChartOut
from app.services import metrics
from app.store import charts as chart_store
from app.store import chunks
from app.store import metrics as metric_store
from tests.app.conftest import TOKEN, post
from tests.postgres import new_database, postgres_bin, postgres_server

KEY = "step_time"
# (step, rank) -> value, as sent.
Points = dict[tuple[int, int], float]


def time_of(step: int, rank: int) -> float:
    """The unix time sent with each point: different on each rank, not a whole number, and not always increasing with
    the step (as a point sent late is), so that a bucket's time must be its last point's, not its latest one."""
    return 1_763_000_000 + step * 0.0371 + rank * 1e-3 + (step * 7919 % 1009) * 0.01


def random_points(rng: random.Random) -> Points:
    """Three ranks of one key: a dense stretch, sparse steps up to 300,000, NaNs (one long run of them), infinities.

    The spread makes requests of every kind: raw points only, every tier, and part-filled tier buckets at the ends.
    """
    points: Points = {}
    for rank in range(3):
        steps = set(range(1000, 1000 + rng.randrange(500, 3000))) | {rng.randrange(300_000) for _ in range(1500)}
        for step in steps:
            points[step, rank] = rng.choice([math.nan, math.inf, -math.inf]) if rng.random() < 0.03 else rng.gauss()
    for step in range(5000, 9000):  # whole buckets of nothing but NaN: their min and max are NaN
        points[step, 1] = math.nan
    return points


def send_shuffled(client: TestClient, run_id: int, points: Points, rng: random.Random) -> None:
    """Posts the points in random order and random batch sizes, re-sending a quarter of the batches later."""
    order = list(points.items())
    rng.shuffle(order)
    batches, start = [], 0
    while start < len(order):
        size = rng.randrange(1, 3000)
        batches.append([wire.Point(KEY, s, v, r, time_of(s, r)) for (s, r), v in order[start : start + size]])
        start += size
    resent = rng.sample(batches, len(batches) // 4)
    for body in [*batches, *resent]:
        assert post(client, run_id, wire.Batch(tuple(body)).to_json()).status_code == 200


def same(got: float | str, want: float) -> bool:
    value = wire.decode_value(got)
    return (math.isnan(value) and math.isnan(want)) or value == want


def assert_exact(
    chart: dict[str, Any],
    points: Points,
    *,
    width: int,
    rank: int | None = None,
    times: Mapping[tuple[int, int], float] | None = None,
) -> None:
    """Each returned bucket holds exactly the points after the previous bucket's step up to its own; checks its values,
    and its time against `times` ((step, rank) -> the time sent; time_of's when not given).

    Buckets are contiguous, and a bucket's step is its highest one, so the points between two returned steps are
    exactly one bucket's: this holds whatever the layout, and so checks min, max, last and its time exactly.
    """
    start, end = chart["start_step"], chart["end_step"]
    by_rank: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for (step, r), value in sorted(points.items()):
        if start <= step <= end and rank in (None, r):
            by_rank[r].append((step, value))
    assert set(chart["ranks"]) == {str(r) for r in by_rank}
    for r, rank_points in by_rank.items():
        got = chart["ranks"][str(r)]
        steps = [step for step, _ in rank_points]
        assert len(got["step"]) <= width and len(got["time"]) == len(got["step"])
        want_times = [time_of(step, r) if times is None else times[step, r] for step in got["step"]]
        assert got["time"] == want_times  # exactly: the float the trainer sent
        assert got["step"][-1] == steps[-1]  # nothing left out at the end
        previous = start - 1
        for step, low, high, last in zip(got["step"], got["min"], got["max"], got["last"], strict=True):
            inside = rank_points[bisect.bisect_right(steps, previous) : bisect.bisect_right(steps, step)]
            assert inside and inside[-1][0] == step
            assert step - inside[0][0] < chart["bucket_steps"]
            finite = [value for _, value in inside if not math.isnan(value)]
            assert same(low, min(finite, default=math.nan)) and same(high, max(finite, default=math.nan))
            assert same(last, inside[-1][1])
            previous = step


def get_chart(client: TestClient, run_id: int, **params: Any) -> dict[str, Any]:
    response = client.get(f"/api/runs/{run_id}/chart", params={"key": KEY, **params})
    assert response.status_code == 200, response.text
    return dict(response.json())


def check_random_requests(client: TestClient, run_id: int, points: Points, rng: random.Random, count: int) -> None:
    last_step = max(step for step, _ in points)
    for width in (1, 3, 1000, 4000):
        assert_exact(get_chart(client, run_id, width=width), points, width=width)  # the whole series
    assert_exact(get_chart(client, run_id, start_step=2, end_step=wire.MAX_STEP, width=9), points, width=9)
    for _ in range(count):
        start = rng.choice([0, rng.randrange(last_step), rng.randrange(900, 1100)])
        end = min(start + rng.choice([5, 100, 3000, 70_000, 400_000]), last_step + 10)
        width, rank = rng.choice([1, 2, 7, 50, 333, 1000, 4000]), rng.choice([None, None, 0, 1, 2, 5])
        params = {"start_step": start, "end_step": end, "width": width} | ({} if rank is None else {"rank": rank})
        assert_exact(get_chart(client, run_id, **params), points, width=width, rank=rank)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_min_max_and_last_are_exact_for_any_range_width_and_rank(client: TestClient, run_id: int, seed: int) -> None:
    rng = random.Random(seed)
    points = random_points(rng)
    send_shuffled(client, run_id, points, rng)
    check_random_requests(client, run_id, points, rng, count=25)


def test_a_chart_answer_is_byte_for_byte_what_its_validated_model_writes(client: TestClient, run_id: int) -> None:
    """A chart is built without validating its thousands of numbers (they come from the store): each answer is the
    JSON of the model validated from it, byte for byte, NaN and infinities as their strings, every rank."""
    rng = random.Random(4)
    send_shuffled(client, run_id, random_points(rng), rng)
    for params in ({"width": 1000}, {"width": 3}, {"width": 50, "start_step": 900, "end_step": 9000},
                   {"width": 7, "rank": 1}, {"start_step": 10**9}):  # fmt: skip
        response = client.get(f"/api/runs/{run_id}/chart", params={"key": KEY, **params})
        assert response.status_code == 200 and response.headers["content-type"] == "application/json"
        assert response.content == ChartOut.model_validate_json(response.content).model_dump_json().encode()


def test_a_single_step_spike_is_the_max_of_its_bucket_when_zoomed_out(client: TestClient, run_id: int) -> None:
    steps = 100_000
    points = {(step, 0): 1.0 / (step + 1) for step in range(steps)}
    points[61_234, 0] = 50.0
    for first in range(0, steps, wire.MAX_POINTS_PER_BATCH):
        body = [wire.Point(KEY, s, points[s, 0], 0, time_of(s, 0))
                for s in range(first, min(first + wire.MAX_POINTS_PER_BATCH, steps))]  # fmt: skip
        post(client, run_id, wire.Batch(tuple(body)).to_json())
    for width in (1000, 20):
        chart = get_chart(client, run_id, width=width)
        buckets = chart["ranks"]["0"]
        assert width // 2 <= len(buckets["step"]) <= width  # coarse, but not coarser than it needs to be
        spike = bisect.bisect_left(buckets["step"], 61_234)
        assert buckets["max"][spike] == 50.0 and max(buckets["max"]) == 50.0
        assert_exact(chart, points, width=width)


def test_a_range_with_fewer_steps_than_the_width_is_the_raw_points(client: TestClient, run_id: int) -> None:
    key = "gpu/node-a/3/util"
    body = [wire.Point(key, step, float(step % 7), 0) for step in range(1_763_700_000, 1_763_720_000, 5)]
    body[3] = wire.Point(key, 1_763_700_015, math.nan, 0)
    post(client, run_id, wire.Batch(tuple(body)).to_json())
    zoomed = client.get(
        f"/api/runs/{run_id}/chart", params={"key": key, "start_step": 1_763_700_000, "end_step": 1_763_700_999}
    ).json()
    raw = [(p.step, wire.encode_value(p.value)) for p in body if p.step <= 1_763_700_999]
    assert zoomed["bucket_steps"] == 1
    buckets = zoomed["ranks"]["0"]
    assert list(zip(buckets["step"], buckets["min"], strict=True)) == raw
    assert buckets["min"] == buckets["max"] == buckets["last"] and buckets["last"][3] == "NaN"
    # Unzoomed, the chart spans the series' own steps, not 0 to now: all of them in one bucket would show nothing.
    whole = client.get(f"/api/runs/{run_id}/chart", params={"key": key, "width": 100}).json()
    assert (whole["start_step"], whole["end_step"]) == (1_763_700_000, 1_763_719_995)
    assert 50 <= len(whole["ranks"]["0"]["step"]) <= 100


def test_steps_sent_again_or_out_of_order_leave_the_chart_as_it_was(client: TestClient, run_id: int) -> None:
    rng = random.Random(7)
    points = random_points(rng)
    send_shuffled(client, run_id, points, rng)
    before = get_chart(client, run_id, width=300)
    again = [wire.Point(KEY, s, points[s, r], r) for s, r in rng.sample(sorted(points), 5000)]
    # One new point, so the batch is stored and the tiers of every bucket it touches are recomputed.
    post(client, run_id, wire.Batch((*again, wire.Point(KEY, 12_345, 9.0, 3))).to_json())
    after = get_chart(client, run_id, width=300)
    assert after["ranks"].pop("3") == {"step": [12_345], "min": [9.0], "max": [9.0], "last": [9.0], "time": [0.0]}
    assert after == before


def test_points_replayed_from_a_spool_reach_the_chart(client: TestClient, run_id: int, tmp_path: Path) -> None:
    points = {(step, 0): float(step % 1000) for step in range(20_000)}
    batches = [
        wire.Batch(tuple(wire.Point(KEY, s, points[s, 0], 0, time_of(s, 0)) for s in range(first, first + 5000)))
        for first in range(0, 20_000, 5000)
    ]
    lines = [json.dumps(batch.to_json()) for batch in batches]
    (tmp_path / "spool-0.jsonl").write_text("\n".join(lines))
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        assert metrics.ingest_leftover_spools(db, run_id=run_id, run_dir=tmp_path) == 20_000
    assert_exact(get_chart(client, run_id, width=40), points, width=40)


def test_points_stored_before_the_tiers_existed_chart_the_same(tmp_path: Path) -> None:
    """Through every migration since: 0004 builds the tiers, 0015 packs the points, 0018 gives the tiers their times."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade_to(alembic_config(url), "0003")
    points = {(step, rank): math.sin(step / 100) * (rank + 1) for step in range(0, 60_000, 3) for rank in (0, 1)}
    with make_engine(url).begin() as connection:
        connection.execute(text(
            "INSERT INTO runs (id, name, status, status_reason, created_at, workload, nproc_per_node, epochs,"
            " batch_size, lr, checkpoint_every, seed, epoch, step, total_steps, samples_per_s, trainer_finished)"
            " VALUES (1, 'old', 'succeeded', '', '2026-01-01 00:00:00', 'mlp', 2, 1, 64, 0.001, 1, 0, 1, 10, 10, 0, 1)"
        ))  # fmt: skip
        connection.execute(text(f"INSERT INTO metric_series (id, run_id, key) VALUES (1, 1, '{KEY}')"))
        connection.execute(
            text("INSERT INTO metric_points (series_id, step, rank, value, time) VALUES (1, :step, :rank, :value, :t)"),
            [{"step": s, "rank": r, "value": v, "t": time_of(s, r)} for (s, r), v in points.items()],
        )
    upgrade(url)
    settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared", database_url=url,
                        supervise_interval_s=3600)  # fmt: skip
    with TestClient(create_app(settings)) as client:
        for width in (1000, 10):
            assert_exact(get_chart(client, 1, width=width), points, width=width)


BEFORE_TIMES = "0017_run_config"


def tier_rows(db: Session) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in db.execute(text("SELECT * FROM metric_tiers ORDER BY series_id, tier, bucket, rank"))]


def store_without_times(db: Session, run_id: int, points: dict[str, Points], rng: random.Random) -> None:
    """The points through the store in a few shuffled batches, their tiers as a store before 0018 kept them."""
    ids = metric_store.series_ids(db, run_id=run_id, keys=points)
    batches = [(key, part) for key, by_step in points.items() for part in np.array_split(list(by_step), 5)]
    rng.shuffle(batches)
    for key, part in batches:
        by_rank: dict[tuple[int, int], list[tuple[int, float, float]]] = defaultdict(list)
        for step, rank in part.tolist():
            by_rank[ids[key], rank].append((step, points[key][step, rank], time_of(step, rank)))
        columns = {owner: chunks.Column.of(*zip(*rows, strict=True)) for owner, rows in by_rank.items()}
        chart_store.refresh_tiers(db, metric_store.insert_points(db, columns, log=False), times=False)


def assert_the_tier_times_migration_fills_every_bucket(url: str, tmp_path: Path) -> None:
    """A store whose tiers have no times (before 0018) gets every bucket's, exactly what ingest writes, in pages of
    chunks (more chunks here than a page holds), and charts with them; a downgrade drops them again."""
    upgrade_to(alembic_config(url), BEFORE_TIMES)
    rng = random.Random(18)
    points = {KEY: random_points(rng), "val_loss": {(step, 0): rng.gauss() for step in range(0, 200_000, 7)}}
    engine = make_engine(url)
    with Session(engine) as db, db.begin():
        run_id = db.scalar(text(
            "INSERT INTO runs (name, status, status_reason, created_at, workload, nproc_per_node, epoch, step,"
            " total_steps, samples_per_s, trainer_finished)"
            " VALUES ('old', 'succeeded', '', '2026-01-01 00:00:00', 'mlp', 3, 0, 0, 0, 0, false) RETURNING id"
        ))  # fmt: skip
        store_without_times(db, run_id, points, rng)
    upgrade(url)
    with Session(engine) as db, db.begin():
        migrated = tier_rows(db)
        db.execute(text("DELETE FROM metric_tiers"))
        stored = db.execute(text("SELECT series_id, rank, n, data FROM metric_chunks")).all()
        assert len(stored) > 2 * 2000  # three pages of the migration's
        every = [chunks.Written(s, rank, chunks.decode(data, n), np.ones(n, bool)) for s, rank, n, data in stored]
        chart_store.refresh_tiers(db, every)
        assert tier_rows(db) == migrated and None not in {row[-1] for row in migrated}
    settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared", database_url=url,
                        supervise_interval_s=3600)  # fmt: skip
    with TestClient(create_app(settings)) as client:
        for key, by_step in points.items():
            for params in ({"width": 1000}, {"width": 9}, {"width": 300, "start_step": 1000, "end_step": 150_000}):
                chart = client.get(f"/api/runs/{run_id}/chart", params={"key": key, **params}).json()
                assert_exact(chart, by_step, width=params["width"])
    downgrade(alembic_config(url), BEFORE_TIMES)
    assert "last_time" not in {column["name"] for column in inspect(engine).get_columns("metric_tiers")}
    engine.dispose()


def test_a_populated_store_gets_its_tiers_times_in_place_and_back(tmp_path: Path) -> None:
    assert_the_tier_times_migration_fills_every_bucket(f"sqlite:///{tmp_path / 'old.db'}", tmp_path)


def test_wrong_requests_are_refused_with_the_field_named(client: TestClient, run_id: int) -> None:
    post(client, run_id, wire.Batch((wire.Point(KEY, 1, 0.5),)).to_json())
    url = f"/api/runs/{run_id}/chart"
    assert client.get("/api/runs/999/chart", params={"key": KEY}).status_code == 404
    unknown = client.get(url, params={"key": "los"})
    assert unknown.status_code == 404 and "'los'" in unknown.json()["detail"]
    for params, field in [
        ({"key": KEY, "start_step": 10, "end_step": 9}, "end_step"),
        ({"key": KEY, "width": 0}, "width"),
        ({"key": KEY, "width": 4001}, "width"),
        ({"key": KEY, "start_step": -1}, "start_step"),
        ({"key": KEY, "rank": "all"}, "rank"),
        ({}, "key"),
    ]:
        response = client.get(url, params=params)
        assert response.status_code == 422, params
        assert response.json()["detail"][0]["loc"][-1] == field


def test_a_range_past_the_last_point_is_an_empty_chart(client: TestClient, run_id: int) -> None:
    post(client, run_id, wire.Batch((wire.Point(KEY, 1, 0.5),)).to_json())
    chart = get_chart(client, run_id, start_step=100)
    assert (chart["start_step"], chart["end_step"], chart["ranks"]) == (100, 100, {})


@pytest.fixture
def pg_client(tmp_path: Path) -> Iterator[TestClient]:
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (scripts/test installs it)")
    with postgres_server() as admin_dsn:
        settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared",
                            database_url=new_database(admin_dsn), supervise_interval_s=3600)  # fmt: skip
        with TestClient(create_app(settings)) as client:
            yield client


def test_min_max_and_last_are_exact_on_postgresql(pg_client: TestClient) -> None:
    run_id = pg_client.post("/api/runs", json={"name": "pg"}).json()["id"]
    with pg_client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.token_hash = RunStatus.running, hash_token(TOKEN)
    rng = random.Random(11)
    points = random_points(rng)
    send_shuffled(pg_client, run_id, points, rng)
    check_random_requests(pg_client, run_id, points, rng, count=15)
