"""The ingest writer: batches posted at once are stored in groups, one transaction each, every point exactly once; a
batch refused in a group gets its own answer while the others are stored; the chart tiers and summaries merged per
group are what a rebuild from the points gives; the series ids it keeps follow a deleted run's id to the new run that
gets it."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from time import monotonic
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from app.core.models import Run, RunStatus, utcnow
from app.core.settings import Settings
from app.main import create_app
from app.schemas.metrics import BatchIn, IngestResult
from app.services import metrics
from app.services.metrics import Post
from app.store import charts as chart_store
from app.store import chunks
from app.store import metrics as metric_store
from app.store import summaries as summary_store
from app.store.charts import TIERS
from app.store.metrics import SeriesIds
from app.workers import ingest_writer
from tests.app.conftest import TOKEN, post, running_run, series
from tests.live import LiveServer, open_run, points, set_run
from tests.postgres import new_database, postgres_bin, postgres_server

SENDERS = 8
BATCHES = 12  # each sender's own, every one posted twice (a retry) and a third time by another sender


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (scripts/test installs it)")
    with postgres_server() as admin_dsn:
        yield new_database(admin_dsn)


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    database = {"RANKBOARD_DATABASE_URL": request.getfixturevalue("postgres_url")} if request.param != "sqlite" else {}
    live = LiveServer(tmp_path, RANKBOARD_SUPERVISE_INTERVAL_S="3600", **database)
    live.start()
    try:
        yield live
    finally:
        live.stop()


def body(sender: int, number: int) -> dict:
    """A node's batch: its GPU sample and its rank's step time at one step, and rank 0's loss there too."""
    step = number + 1
    columns = [wire.Column(f"gpu/node-{sender}/0/util", sender, [1_700_000_000 + step], [50.0 + step], [1.7e9]),
               wire.Column("rank/step_ms", sender, [step], [100.0 + sender], [1.7e9]),
               wire.Column("loss", 0, [step], [1.0 / step], [1.7e9])]  # fmt: skip
    beat = wire.Heartbeat(sender, f"node-{sender}", step)
    return wire.Batch(columns=tuple(columns), heartbeat=beat).to_json()


def send_all(server: LiveServer, run_id: int, ended: int) -> tuple[list[int], list[int], int]:
    """Every sender's batches from threads at once, each twice and once more by the next sender; one sender also
    posts into the ended run and with a wrong token. Returns the statuses, and each 200's `stored`, and the count
    of distinct points sent."""
    statuses: list[int] = []
    stored: list[int] = []
    start = threading.Barrier(SENDERS)

    def sender(me: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            start.wait()
            for number in range(BATCHES):
                for owner in (me, me, (me + 1) % SENDERS):
                    answer = client.post(f"/api/runs/{run_id}/metrics", json=body(owner, number),
                                         headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
                    statuses.append(answer.status_code)
                    stored.append(answer.json()["stored"] if answer.status_code == 200 else 0)
                if me == 0 and number == BATCHES // 2:
                    for target, token in ((ended, TOKEN), (run_id, "not-the-token")):
                        answer = client.post(f"/api/runs/{target}/metrics", json=body(me, number),
                                             headers={"Authorization": f"Bearer {token}"})  # fmt: skip
                        statuses.append(answer.status_code)

    threads = [threading.Thread(target=sender, args=(me,)) for me in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    distinct = SENDERS * BATCHES * 2 + BATCHES  # a GPU sample and a step time per batch; the loss per step
    return statuses, stored, distinct


def test_batches_posted_at_once_are_stored_exactly_once_and_a_refused_one_gets_its_own_answer(
    server: LiveServer,
) -> None:
    run_id, ended = open_run(server, TOKEN), open_run(server, TOKEN)
    set_run(server, ended, status=RunStatus.succeeded, finished_at=utcnow())
    statuses, stored, distinct = send_all(server, run_id, ended)
    assert sorted(statuses) == sorted([200] * SENDERS * BATCHES * 3 + [401, 409])
    assert sum(stored) == distinct  # each point stored by one batch, counted by that batch's answer only
    with server.api() as api:
        steps = [(p["step"], p["rank"]) for p in points(api, run_id, "rank/step_ms")]
        assert steps == sorted((n + 1, me) for n in range(BATCHES) for me in range(SENDERS))
        assert [p["step"] for p in points(api, run_id, "loss")] == list(range(1, BATCHES + 1))
        for me in range(SENDERS):
            assert len(points(api, run_id, f"gpu/node-{me}/0/util")) == BATCHES
        assert points(api, ended, "loss") == []
        chart = api.get(f"/api/runs/{run_id}/chart", params={"key": "loss", "width": 100}).json()
        assert chart["end_step"] == BATCHES
        ranks = {rank["rank"]: rank["step"] for rank in api.get(f"/api/runs/{run_id}/ranks").json()}
        assert ranks == {me: BATCHES for me in range(SENDERS)}


def test_a_post_that_fails_in_the_database_costs_its_group_a_retry_post_by_post_and_no_point(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = running_run(client, "first"), running_run(client, "second")
    sessions = client.app.state.sessions  # type: ignore[attr-defined]
    with sessions() as db:
        made = db.scalar(select(Run.created_at).where(Run.id == second))
    cache = SeriesIds()
    cache.keep({(second, made, "loss"): 10**9})  # a series id gone from the database (kept for a deleted run)
    posts = [Post(run_id, TOKEN, BatchIn.model_validate({"points": [{"key": "loss", "step": step, "value": 1.0,
             "time": 1.0}]})) for run_id, step in ((first, 1), (second, 1), (first, 2))]  # fmt: skip
    with sessions() as db:
        outcomes = metrics.ingest_group(db, posts, series=cache)
    assert "a group of 3 batches failed as a whole: each is stored on its own" in caplog.text
    assert [getattr(outcome, "stored", None) for outcome in outcomes] == [1, 1, 1]
    assert series(client, first) == [(1, 0, 1.0), (2, 0, 1.0)] and series(client, second) == [(1, 0, 1.0)]


def test_posts_of_one_group_that_repeat_each_others_points_keep_the_first_value_and_count_only_new_points(
    client: TestClient,
) -> None:
    # A group writes its posts' points at once, but a retry in the same group, or a batch overlapping another, is
    # written after the post it repeats: the first value sent stays, and each post counts only the points it added.
    run_id = running_run(client, "retries")

    def loss(steps: range, value: float, token: str = TOKEN) -> Post:
        points = [{"key": "loss", "step": step, "value": value, "time": 1.0} for step in steps]
        return Post(run_id, token, BatchIn.model_validate({"points": points}))

    other = Post(
        run_id, TOKEN, BatchIn.model_validate({"points": [{"key": "lr", "step": 1, "value": 0.1, "time": 1.0}]})
    )
    posts = [
        loss(range(1, 4), 1.0),
        loss(range(2, 5), 2.0),
        loss(range(1, 9), 3.0, "wrong"),
        other,
        loss(range(1, 4), 1.0),
    ]
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        outcomes = metrics.ingest_group(db, posts)
    assert [getattr(outcome, "stored", type(outcome).__name__) for outcome in outcomes] == [3, 1, "InvalidToken", 1, 0]
    assert series(client, run_id) == [(1, 0, 1.0), (2, 0, 1.0), (3, 0, 1.0), (4, 0, 2.0)]
    assert series(client, run_id, "lr") == [(1, 0, 0.1)]


def test_one_group_keeps_what_each_of_its_posts_said_of_the_run(client: TestClient) -> None:
    # The group writes its run's row once, at the commit: a node's inventory or a step must not be lost to the next
    # post's reread of the row. Its ranks' heartbeats too are written once, each rank's last word.
    run_id, other = running_run(client, "nodes"), running_run(client, "other")
    sessions = client.app.state.sessions  # type: ignore[attr-defined]
    posts = [Post(run_id, TOKEN, BatchIn.model_validate({
        "points": [{"key": "loss", "step": step, "value": 1.0, "time": 1.0}],
        "node": wire.Node(host, (wire.Gpu(0, f"GPU-{host}", "NVIDIA H100"),)).to_json(),
        "heartbeats": [{"rank": rank, "host": host, "step": step} for rank in ranks],
    })) for step, host, ranks in ((5, "node-a", (0, 1)), (6, "node-b", (0,)))]  # fmt: skip
    posts.append(Post(other, TOKEN, BatchIn.model_validate({"heartbeats": [{"rank": 0, "host": "node-c", "step": 9}]})))
    with sessions() as db:
        outcomes = metrics.ingest_group(db, posts)
    assert [outcome.stored for outcome in outcomes] == [1, 1, 0]  # type: ignore[union-attr]
    run = client.get(f"/api/runs/{run_id}").json()
    assert [node["host"] for node in run["gpus"]] == ["node-a", "node-b"] and run["step"] == 6

    def ranks(run_id: int) -> list[tuple[int, str, int]]:
        return [(rank["rank"], rank["host"], rank["step"]) for rank in client.get(f"/api/runs/{run_id}/ranks").json()]

    assert ranks(run_id) == [(0, "node-b", 6), (1, "node-a", 5)] and ranks(other) == [(0, "node-c", 9)]


def test_a_group_logs_one_row_per_run_and_each_live_page_reads_its_own_runs_points_from_any_cursor(
    client: TestClient,
) -> None:
    # Two nodes of one run and a node of another in one group, as the ingest writer stores them: the live pages' log
    # takes a row per run, and a page reads its run's points only, from a cursor inside a row too.
    first, second = running_run(client, "first"), running_run(client, "second")
    sessions = client.app.state.sessions  # type: ignore[attr-defined]

    def node(run_id: int, ranks: range, value: float) -> Post:
        columns = [{"key": key, "rank": rank, "steps": [7, 8], "values": [value + rank, value + rank + 0.5],
                    "times": [1.7e9, 1.7e9 + 1]} for key in ("gpu/util", "step_time") for rank in ranks]  # fmt: skip
        return Post(run_id, TOKEN, BatchIn.model_validate({"columns": columns}))

    with sessions() as db:
        outcomes = metrics.ingest_group(db, [node(first, range(0, 2), 10.0), node(second, range(0, 1), 50.0),
                                             node(first, range(2, 4), 10.0)])  # fmt: skip
        assert [outcome.stored for outcome in outcomes] == [8, 4, 8]  # type: ignore[union-attr]
        assert db.execute(text("SELECT run_id, n FROM metric_recent ORDER BY id")).all() == [(first, 16), (second, 4)]
        ours = metric_store.points_after(db, run_id=first, after_id=0, limit=1000)
        assert [point.id for point in ours] == list(range(1, 17))
        assert {(p.key, p.step, p.rank, p.value) for p in ours} == {
            (key, step, rank, 10.0 + rank + (step - 7) * 0.5)
            for key in ("gpu/util", "step_time") for step in (7, 8) for rank in range(4)
        }  # fmt: skip
        theirs = metric_store.points_after(db, run_id=second, after_id=0, limit=1000)
        assert [(p.id, p.value) for p in theirs] == [(17, 50.0), (18, 50.5), (19, 50.0), (20, 50.5)]
        assert metric_store.points_after(db, run_id=first, after_id=9, limit=1000) == ours[9:]
        watched, others = metric_store.watched_points_after(
            db, run_id=first, after_id=3, limit=1000, watch=frozenset({"step_time"})
        )
        assert watched == [point for point in ours[3:] if point.key == "step_time"] and others == {"gpu/util"}


def test_a_new_run_that_gets_a_deleted_runs_id_gets_series_of_its_own(client: TestClient) -> None:
    first = running_run(client, "first")
    batch = {"points": [{"key": key, "step": 1, "value": 1.0, "time": 1.0} for key in ("loss", "val_loss")]}
    assert post(client, first, batch).status_code == 200
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.execute(text("UPDATE runs SET status = 'succeeded' WHERE id = :r"), {"r": first})
    assert client.delete(f"/api/runs/{first}").status_code == 200
    second = running_run(client, "second")
    assert second == first  # SQLite gives the deleted run's id to the next: the ids kept for it must not be used
    answer = post(client, second, {"points": [{"key": "loss", "step": 7, "value": 2.0, "time": 1.0}]})
    assert answer.status_code == 200 and answer.json()["stored"] == 1
    assert series(client, second) == [(7, 0, 2.0)]
    assert client.get(f"/api/runs/{second}/metrics").json() == ["loss"]
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        orphans = db.scalar(text("SELECT COUNT(*) FROM metric_chunks WHERE series_id NOT IN"
                                 " (SELECT id FROM metric_series)"))  # fmt: skip
    assert orphans == 0


def stored_aggregates(db: Session) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The summaries, and the tier rows that charts read: every one of the finest tier, and of a coarser tier those
    of the buckets closed (wholly at or below their series' highest step; ingest builds a bucket once it is)."""
    tiers = db.execute(text(f"SELECT * FROM metric_tiers t WHERE t.tier = {TIERS[0]} OR (t.bucket + 1) * t.tier - 1"
                            " <= (SELECT m.last_step FROM metric_summaries m WHERE m.series_id = t.series_id)"
                            " ORDER BY series_id, tier, bucket, rank")).all()  # fmt: skip
    summaries = db.execute(text("SELECT * FROM metric_summaries ORDER BY series_id")).all()
    return [tuple(row) for row in tiers], [tuple(row) for row in summaries]


def shuffled_posts(rng: random.Random, run_id: int) -> list[Post]:
    """Batches of two keys and three ranks over 40,000 steps, out of order, some sent twice, with NaN and ties; then
    a sampler's: a step or three each, now and then one a post late (ingest appends these to their chunk's tail)."""
    posts = []
    for first in rng.sample(range(0, 40_000, 500), 80):
        steps = sorted(rng.sample(range(first, first + 500), 200))
        posts.append(batch(rng, run_id, steps))
    sampled = [batch(rng, run_id, list(range(first, first + rng.randint(1, 3)))) for first in range(40_000, 40_600, 3)]
    for late in rng.sample(range(1, len(sampled)), 40):
        sampled[late - 1], sampled[late] = sampled[late], sampled[late - 1]
    return posts + rng.sample(posts, 20) + sampled + rng.sample(sampled, 20)


def batch(rng: random.Random, run_id: int, steps: list[int]) -> Post:
    """The steps of two keys and three ranks, as one post."""
    columns = [{"key": key, "rank": rank, "steps": steps, "times": [1.7e9 + s for s in steps],
                "values": [math.nan if rng.random() < 0.02 else round(rng.gauss(0, 1), 2) for _ in steps]}
               for key in ("loss", "gpu/util") for rank in range(3)]  # fmt: skip
    return Post(run_id, TOKEN, BatchIn.model_validate({"columns": columns}))


def sent_points(posts: list[Post]) -> dict[tuple[str, int, int], tuple[float, float]]:
    """(key, step, rank) -> (value, time) of every point the posts carry: the first sent of each."""
    sent: dict[tuple[str, int, int], tuple[float, float]] = {}
    for one in posts:
        for column in one.batch.columns:
            for step, value, time in zip(column.steps, column.values, column.times, strict=True):
                sent.setdefault((column.key, step, column.rank), (value, time))
    return sent


def stored_points(db: Session, run_id: int) -> dict[tuple[str, int, int], tuple[float, float]]:
    """(key, step, rank) -> (value, time) of every point the run's chunks hold, each once."""
    query = text("SELECT s.key, c.rank, c.n, c.data FROM metric_chunks c JOIN metric_series s ON s.id = c.series_id"
                 " WHERE s.run_id = :run")  # fmt: skip
    rows = db.execute(query, {"run": run_id}).all()
    stored = {}
    for key, rank, n, data in rows:
        column = chunks.decode(bytes(data), n)
        for step, value, time in zip(*(part.tolist() for part in column.columns()), strict=True):
            assert (key, step, rank) not in stored
            stored[key, step, rank] = (value, time)
    return stored


def gathered(lane: ingest_writer._Lane, first: ingest_writer._Job) -> list[ingest_writer._Job]:
    """The writer's group that starts with `first`: fails rather than hang, should it wait its whole linger."""
    group: list[ingest_writer._Job] = []
    thread = threading.Thread(target=lambda: group.extend(lane.gathered(first)), daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive(), "the group waited for a post that was not coming"
    return group


def test_a_group_waits_for_other_senders_posting_at_once_and_never_for_a_lone_or_gone_one() -> None:
    lane = ingest_writer._Lane(linger=600.0)  # a wait to its end would hang: `gathered` says so
    batch = BatchIn.model_validate({"points": []})

    def job(sender: str) -> ingest_writer._Job:
        lane.senders.saw(sender, monotonic())
        return ingest_writer._Job(Post(1, TOKEN, batch), Future(), sender, monotonic())

    # A sender whose last post was half a second ago: its next, if any, is not due within the wait.
    lane.senders.saw("node-z", monotonic() - 0.5)
    alone = job("node-a")
    assert gathered(lane, alone) == [alone]  # one sender posting: its post is stored at once
    first, second = job("node-a"), job("node-b")  # two senders posting at once: the group waits for the second
    threading.Timer(0.2, lane.queue.put, [second]).start()
    assert gathered(lane, first) == [first, second]


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_tiers_and_summaries_merged_per_group_are_what_a_rebuild_from_the_points_gives(
    request: pytest.FixtureRequest, database: str, tmp_path: Path
) -> None:
    url = request.getfixturevalue("postgres_url") if database == "postgresql" else None
    settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared", database_url=url,
                        supervise_interval_s=3600)  # fmt: skip
    with TestClient(create_app(settings)) as client:
        run_id = running_run(client)
        posts, rng = shuffled_posts(random.Random(39), run_id), random.Random(4)
        sent, cache = sent_points(posts), SeriesIds()
        with client.app.state.sessions() as db:  # type: ignore[attr-defined]
            while posts:  # groups of 1 to 30 posts, as the writer takes what came meanwhile
                group = posts[: rng.randint(1, 30)]
                posts = posts[len(group) :]
                assert all(isinstance(o, IngestResult) for o in metrics.ingest_group(db, group, series=cache))
        sessions = client.app.state.sessions  # type: ignore[attr-defined]
        with sessions() as db:
            merged = stored_aggregates(db)
            assert np.testing.assert_equal(stored_points(db, run_id), sent) is None  # NaN equals NaN here
            tailed = db.scalar(text("SELECT COUNT(*) FROM metric_chunks WHERE substr(data, 1, 1) = :tailed"),
                               {"tailed": bytes((chunks.TAILED,))})  # fmt: skip
            assert tailed  # some chunks had points appended, and are read back with the rest
        with sessions() as db:
            with db.begin():
                db.execute(text("DELETE FROM metric_tiers"))
                db.execute(text("DELETE FROM metric_summaries"))
                rows = db.execute(text("SELECT series_id, rank, n, data FROM metric_chunks")).all()
                every = [chunks.Written(s, rank, chunks.decode(data, n), np.ones(n, bool)) for s, rank, n, data in rows]
                chart_store.refresh_tiers(db, every)
                summary_store.refresh(db, {chunk.series_id for chunk in every})
            assert stored_aggregates(db) == merged
