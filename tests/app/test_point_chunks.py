"""Points packed in chunks: an old store of one row per point converts in place with every point intact and the same
charts, and back; the live pages' log of new points keeps only the newest."""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
from alembic.command import downgrade, upgrade
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import text
from sqlalchemy.orm import Session

from app.core.db import alembic_config, make_engine
from app.core.settings import Settings
from app.main import create_app
from app.store import charts as chart_store
from app.store import chunks
from app.store import metrics as metric_store
from tests.app.conftest import post, running_run, series
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


SAMPLES_REVISION = "0021_sample_chunks"
# Per series: (values of n steps, what 0021 leaves its chunks as): whole numbers, NVML's milliwatts as watts,
# psutil's one-decimal percent, bytes; a NaN keeps its chunk as floats; a noisy float, and a key that is no sample.
SAMPLE_KINDS = {
    "gpu/node-a/0/util": lambda rng, n: [float(rng.choice([100, 100, 100, 97, 0])) for _ in range(n)],
    "gpu/node-a/0/power": lambda rng, n: [rng.randrange(600_000, 700_000) / 1000 for _ in range(n)],
    "gpu/node-a/0/temp": lambda rng, n: [math.nan if i == 7 else float(40 + i % 30) for i in range(n)],
    "sys/node-b/cpu_percent": lambda rng, n: [rng.randrange(0, 1001) / 10 for _ in range(n)],
    "sys/node-b/mem_used": lambda rng, n: [float(rng.randrange(2**30, 2**36) // 4096 * 4096) for _ in range(n)],
    "gpu/node-a/0/odd": lambda rng, n: [rng.gauss() for _ in range(n)],
    "epoch": lambda rng, n: [float(i // 1000) for i in range(n)],
}


def sample_points(rng: random.Random, n: int) -> dict[str, tuple[list[int], list[float], list[float]]]:
    """Each kind's points at unix-second steps (a gap in the middle), times a second apart with a sampler's jitter."""
    steps = [1_763_000_000 + i + (500 if i >= n // 2 else 0) for i in range(n)]
    times = [step + 0.25 + rng.random() * 1e-3 for step in steps]
    return {key: (steps, make(rng, n), times) for key, make in SAMPLE_KINDS.items()}


def chunk_rows(db: Session) -> dict[tuple[str, int, int], tuple[int, bytes]]:
    """(key, chunk, rank) -> (n, data) of every chunk."""
    rows = db.execute(text("SELECT s.key, c.chunk, c.rank, c.n, c.data FROM metric_chunks c"
                           " JOIN metric_series s ON s.id = c.series_id")).all()  # fmt: skip
    return {(key, chunk, rank): (n, bytes(data)) for key, chunk, rank, n, data in rows}


def appended_records(data: bytes) -> int:
    """How many raw records ingest appended after a chunk's packed points (chunks.TAILED: the packed part's length
    follows the first byte)."""
    (packed,) = struct.unpack_from("<I", data, 1)
    return (len(data) - 5 - packed) // chunks.RECORD.size


def as_floats(n: int, data: bytes) -> bytes:
    """The chunk as shuffled floats: how every chunk was stored before 0021."""
    column = chunks.decode(data, n)
    return chunks.encode(column.steps, column.values, column.times)


def what_readers_return(db: Session, ids: dict[str, int]) -> dict[str, Any]:
    """Every reader of the points over each series: the points, charts of three widths, the tiers, the count."""
    seen: dict[str, Any] = {"tiers": db.execute(text("SELECT * FROM metric_tiers ORDER BY 1, 2, 3, 4")).all()}
    for key, series_id in ids.items():
        points = chunks.read(db, series_id=series_id, first=0, last=2**62)
        seen[key] = [column.tobytes() for column in points.columns()]
        first, last = chunks.step_range(db, series_id=series_id) or (0, 0)
        for width in (1000, 50, 3):
            plan = chart_store.plan(start_step=first, end_step=last, width=width)
            found = chart_store.buckets(db, series_id=series_id, chart=plan, rank=None, last_step=last)
            seen[key, width] = [column.tobytes() for column in found.columns()]
        seen[key, "count"] = chunks.count(db, series_ids=[series_id])
        seen[key, "newest"] = [c.tobytes() for c in chunks.newest_points(db, series_id=series_id, limit=10).columns()]
    return seen


def assert_samples_convert_in_place_and_back(url: str, tmp_path: Path) -> None:
    """A store whose samples were kept as floats (before 0021) gets them coded as samples, more chunks than a page
    of the migration's, each exactly as ingest now writes it, every reader returning what it did; and back."""
    before = ScriptDirectory.from_config(alembic_config(url)).get_revision(SAMPLES_REVISION).down_revision
    assert isinstance(before, str)
    upgrade(alembic_config(url), before)
    sent = sample_points(random.Random(19), 64 * 2100)
    engine = make_engine(url)
    with Session(engine) as db, db.begin():
        run_id = db.scalar(text(
            "INSERT INTO runs (name, status, status_reason, created_at, workload, nproc_per_node, epoch, step,"
            " total_steps, samples_per_s, trainer_finished)"
            " VALUES ('old', 'succeeded', '', '2026-01-01 00:00:00', 'mlp', 2, 0, 0, 0, 0, false) RETURNING id"
        ))  # fmt: skip
        ids = metric_store.series_ids(db, run_id=run_id, keys=sent)
        columns = {(ids[key], rank): chunks.Column.of(*points) for key, points in sent.items() for rank in (0, 1)}
        chart_store.refresh_tiers(db, chunks.write(db, columns))  # as ingest wrote them before 0021: floats
        was, seen = chunk_rows(db), what_readers_return(db, ids)
    upgrade(alembic_config(url), "head")
    with Session(engine) as db:
        now = chunk_rows(db)
        assert what_readers_return(db, ids) == seen
    converted = {row for row, (_n, data) in now.items() if data[0] == chunks.SAMPLES}
    with_nan = {row for row, (n, data) in now.items() if np.isnan(chunks.decode(data, n).values).any()}
    kept = {row for row in now if row[0] in ("gpu/node-a/0/odd", "epoch")} | with_nan
    assert len(with_nan) == 2 and converted == now.keys() - kept and all(now[row] == was[row] for row in kept)
    for row in converted:  # byte for byte what ingest writes for these points now
        column = chunks.decode(now[row][1], now[row][0])
        assert chunks.encode(column.steps, column.values, column.times, samples=True) == now[row][1]
    assert sum(len(now[row][1]) for row in converted) < 0.75 * sum(len(was[row][1]) for row in converted)
    downgrade(alembic_config(url), before)
    with Session(engine) as db:
        assert chunk_rows(db) == was and what_readers_return(db, ids) == seen
    engine.dispose()


def test_a_populated_store_codes_its_samples_as_samples_in_place_and_back(tmp_path: Path) -> None:
    assert_samples_convert_in_place_and_back(f"sqlite:///{tmp_path / 'old.db'}", tmp_path)


def test_samples_sent_are_stored_as_samples_and_read_back_bit_for_bit(client: TestClient) -> None:
    """Through the ingest API, two seconds a batch as a sampler's client sends them: every reader over HTTP (points,
    CSV, charts) answers the values and times sent, bit for bit, and the samples take fewer bytes than floats."""
    run_id = running_run(client)
    sent = sample_points(random.Random(7), 300)
    for first in range(0, 300, 2):
        part = slice(first, first + 2)
        columns = [{"key": key, "rank": 0, "steps": steps[part], "values": [wire.encode_value(v) for v in values[part]],
                    "times": times[part]} for key, (steps, values, times) in sent.items()]  # fmt: skip
        post(client, run_id, {"columns": columns})
    for key, (steps, values, times) in sent.items():
        want = {(key, step, 0): (value, time) for step, value, time in zip(steps, values, times, strict=True)}
        assert_same(series_points(client, run_id, key), want)
        csv = client.get(f"/api/runs/{run_id}/metrics/{key}", params={"format": "csv"}).text.splitlines()[1:]
        assert csv == [
            f"{s},0,{'NaN' if v != v else repr(v)},{t!r}" for s, v, t in zip(steps, values, times, strict=True)
        ]
        by_step = {(step, 0): value for step, value in zip(steps, values, strict=True)}
        for width in (1000, 40):
            chart = client.get(f"/api/runs/{run_id}/chart", params={"key": key, "width": width}).json()
            assert_exact(chart, by_step, width=width, times={(s, 0): t for s, t in zip(steps, times, strict=True)})
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        every = chunk_rows(db)
    # Only a series' newest chunk keeps the raw records ingest appended to it (read back above with the rest), and
    # no more than TAIL_MAX of them: the one before it was packed whole when the newest began.
    newest = {key: max(chunk for name, chunk, _rank in every if name == key) for key in SAMPLE_KINDS}
    tailed = {row: appended_records(data) for row, (_n, data) in every.items() if data[0] == chunks.TAILED}
    assert tailed and all(chunk == newest[key] and 0 < records <= chunks.TAIL_MAX
                          for (key, chunk, _rank), records in tailed.items())  # fmt: skip
    stored = {row: every[row] for row in every.keys() - tailed.keys()}
    for key in SAMPLE_KINDS:  # the samples in fewer bytes than as floats, each; a noisy float kept as floats
        rows = [row for row in stored if row[0] == key]
        size, floats = sum(len(stored[row][1]) for row in rows), sum(len(as_floats(*stored[row])) for row in rows)
        assert size == floats if key == "gpu/node-a/0/odd" else size < floats, key
    kinds = {key: {stored[row][1][0] for row in stored if row[0] == key} for key in SAMPLE_KINDS}
    assert kinds["gpu/node-a/0/odd"] == {chunks.SHUFFLED} and kinds["gpu/node-a/0/temp"] == {
        chunks.SHUFFLED,
        chunks.SAMPLES,
    }
    assert all(
        kinds[key] == {chunks.SAMPLES} for key in SAMPLE_KINDS if key not in ("gpu/node-a/0/odd", "gpu/node-a/0/temp")
    )


def test_a_chunk_starts_as_records_and_the_one_before_is_packed_once_the_newest_is(client: TestClient) -> None:
    """One point a post, as a sampler posts: a (series, rank)'s new chunk starts as raw records; the chunk before it
    keeps its tail until the new one is first packed whole (each series at its own count, so that a big job's
    chunks are not all packed in one second), and a chunk too sparse ever to be packed so is packed once the next
    starts. Every point reads back all the while."""
    run_id, sent = running_run(client), {"gpu/util": list(range(64 + 6)), "loss": list(range(0, 200, 10))}
    for i in range(max(len(steps) for steps in sent.values())):
        columns = [{"key": key, "rank": 0, "steps": steps[i : i + 1], "values": [float(i)], "times": [1.7e9 + i]}
                   for key, steps in sent.items() if i < len(steps)]  # fmt: skip
        post(client, run_id, {"columns": columns})

    def kinds() -> dict[tuple[str, int], int]:
        with client.app.state.sessions() as db:  # type: ignore[attr-defined]
            return {(key, chunk): data[0] for (key, chunk, _rank), (_n, data) in chunk_rows(db).items()}

    packed = (chunks.SAMPLES, chunks.SHUFFLED)
    assert kinds()[("gpu/util", 0)] == chunks.TAILED and kinds()[("gpu/util", 1)] == chunks.RECORDS
    assert kinds()[("loss", 2)] == chunks.RECORDS and all(kinds()[("loss", chunk)] in packed for chunk in range(2))
    for step in range(64 + 6, 64 + chunks.TAIL_MAX + 1):
        post(client, run_id, {"columns": [{"key": "gpu/util", "rank": 0, "steps": [step], "values": [1.0],
                                           "times": [1.7e9 + step]}]})  # fmt: skip
    assert kinds()[("gpu/util", 0)] in packed and kinds()[("gpu/util", 1)] == chunks.TAILED
    assert [step for step, _rank, _value in series(client, run_id, "gpu/util")] == list(range(64 + chunks.TAIL_MAX + 1))
    assert [step for step, _rank, _value in series(client, run_id, "loss")] == sent["loss"]


def stored_and_logged(
    db: Session, run_id: int, *, by_series: bool = False
) -> tuple[dict[str, Any], list[metric_store.StoredPoint]]:
    """Every series' points, and the live pages' log of them, as the store reads them; `by_series`: the log as a
    server before 0026 kept it."""
    points = {key: metric_store.points_in_range(db, run_id=run_id, key=key, start_step=0, start_rank=0,
                                                end_step=None, limit=10**6) for key in SAMPLE_KINDS}  # fmt: skip
    if by_series:
        return points, logged_by_series(db, run_id)
    return points, metric_store.points_after(db, run_id=run_id, after_id=0, limit=10**6)


def logged_by_series(db: Session, run_id: int) -> list[metric_store.StoredPoint]:
    """The log of a store before 0026: a row per (series, rank), numbered by its last point."""
    query = text(
        "SELECT r.id, s.key, r.rank, r.n, r.data FROM metric_recent r JOIN metric_series s"
        " ON s.id = r.series_id WHERE s.run_id = :run_id ORDER BY r.id"
    )
    rows = db.execute(query, {"run_id": run_id})
    logged = []
    for last_id, key, rank, n, data in rows:
        column = chunks.decode(data, n)
        points = zip(column.steps.tolist(), column.values.tolist(), column.times.tolist(), strict=True)
        logged += [metric_store.StoredPoint(last_id - n + 1 + i, key, step, rank, value, time)
                   for i, (step, value, time) in enumerate(points)]  # fmt: skip
    return logged


def assert_tails_are_packed_whole_going_back(settings: Settings) -> None:
    """A store that ingest appended raw records to (one sample a key a post, as a GPU node's), taken back to 0023:
    every chunk and log row as a server of 0023 reads them, with the same points; and forward again."""
    url, sent = settings.sqlalchemy_url, sample_points(random.Random(3), 150)  # the newest chunks: 10 records each
    with TestClient(create_app(settings)) as client:
        run_id = running_run(client)
        for i in range(150):
            columns = [{"key": key, "rank": 0, "steps": steps[i : i + 1], "values": [wire.encode_value(values[i])],
                        "times": times[i : i + 1]} for key, (steps, values, times) in sent.items()]  # fmt: skip
            post(client, run_id, {"columns": columns})
        with client.app.state.sessions() as db:  # type: ignore[attr-defined]
            kinds = set(db.scalars(text("SELECT substr(data, 1, 1) FROM metric_chunks")))
            before = stored_and_logged(db, run_id)
    assert {bytes((chunks.TAILED,)), bytes((chunks.RECORDS,))} <= kinds and before[1]
    engine = make_engine(url)
    for revision, log_kind in (("0023_run_costs", chunks.SHUFFLED), ("head", metric_store.LOGGED)):
        (downgrade if revision != "head" else upgrade)(alembic_config(url), revision)
        with Session(engine) as db:
            kinds = set(db.scalars(text("SELECT substr(data, 1, 1) FROM metric_chunks")))
            logged = set(db.scalars(text("SELECT substr(data, 1, 1) FROM metric_recent")))
            assert {kind[0] for kind in kinds} == {chunks.SAMPLES, chunks.SHUFFLED}
            assert {kind[0] for kind in logged} == {log_kind}
            assert repr(stored_and_logged(db, run_id, by_series=revision != "head")) == repr(before)  # NaN as NaN
    engine.dispose()


def assert_the_live_log_keeps_every_point_and_its_number_both_ways(settings: Settings) -> None:
    """The live pages' log of two runs, rows of several (series, rank) each, taken back to 0025 (a row per series
    and rank) and forward again: every point of each run, with its number, where a page open across either move
    reads on from its cursor."""
    with TestClient(create_app(settings)) as client:
        runs = [running_run(client, name) for name in ("first", "second")]
        for step in range(1, 21):
            for n, run_id in enumerate(runs):
                columns = [{"key": key, "rank": rank, "steps": [step], "values": [step + rank + n / 2],
                            "times": [1.7e9 + step]} for key in ("loss", "gpu/util") for rank in range(2)]  # fmt: skip
                assert post(client, run_id, {"columns": columns}).status_code == 200
        with client.app.state.sessions() as db:  # type: ignore[attr-defined]
            logged = {run_id: metric_store.points_after(db, run_id=run_id, after_id=0, limit=10**6) for run_id in runs}
    assert [len(points) for points in logged.values()] == [80, 80]
    url, engine = settings.sqlalchemy_url, make_engine(settings.sqlalchemy_url)
    for revision in ("0025_login_failures", "head"):
        (downgrade if revision != "head" else upgrade)(alembic_config(url), revision)
        with Session(engine) as db:
            if revision == "head":
                assert {run_id: metric_store.points_after(db, run_id=run_id, after_id=0, limit=10**6)
                        for run_id in runs} == logged  # fmt: skip
            else:
                assert {run_id: logged_by_series(db, run_id) for run_id in runs} == logged
    engine.dispose()


def test_the_live_log_keeps_every_point_and_its_number_going_back_a_revision_and_forward(settings: Settings) -> None:
    assert_the_live_log_keeps_every_point_and_its_number_both_ways(settings)


def test_chunks_with_appended_records_are_packed_whole_going_back_a_revision(settings: Settings) -> None:
    assert_tails_are_packed_whole_going_back(settings)
