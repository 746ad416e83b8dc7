"""The ingest endpoint: one transaction per batch, idempotent on (run, key, step, rank), NaN and inf kept."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rankboard import wire

from app.auth.passwords import sha256 as hash_token
from app.core.models import Run, RunStatus, utcnow
from app.launcher import external
from tests.app.conftest import TOKEN, batch, post, ranks_at_each_step, read_all_pages, series
from tests.live import LiveServer, open_run


def test_a_retried_batch_stores_each_point_once(client: TestClient, run_id: int) -> None:
    first = post(client, run_id, batch(1, 2, 3))
    retry = post(client, run_id, batch(2, 3, 4))
    assert first.json() == {"accepted": 3, "stored": 3}
    assert retry.json() == {"accepted": 3, "stored": 1}
    assert [s for s, _, _ in series(client, run_id)] == [1, 2, 3, 4]


def test_the_same_step_from_two_ranks_is_two_points(client: TestClient, run_id: int) -> None:
    body = {
        "points": [
            {"key": "step_time", "step": 5, "value": 0.1, "rank": 0},
            {"key": "step_time", "step": 5, "value": 0.3, "rank": 1},
        ]
    }
    assert post(client, run_id, body).json()["stored"] == 2
    assert series(client, run_id, "step_time") == [(5, 0, 0.1), (5, 1, 0.3)]


def test_columns_sent_out_of_order_or_with_a_step_twice_store_each_step_once_in_order(
    client: TestClient, run_id: int
) -> None:
    # One batch, several columns: each is cut from arrays shared by all of them, a disordered one sorted on its own.
    columns = (
        wire.Column("a", 0, [5, 6, 7], [0.5, 0.6, 0.7], [1.0] * 3),
        wire.Column("b", 0, [9, 2, 9, 4], [0.9, 0.2, 9.9, 0.4], [1.0] * 4),  # step 9 twice: the first sent is kept
        wire.Column("c", 0, [1, 3], [0.1, 0.3], [1.0] * 2),  # below the column before: in order on its own
        wire.Column("a", 1, [8, 8], [0.8, 8.8], [1.0] * 2),
    )
    assert post(client, run_id, wire.Batch(columns=columns).to_json()).json() == {"accepted": 11, "stored": 9}
    assert series(client, run_id, "a") == [(5, 0, 0.5), (6, 0, 0.6), (7, 0, 0.7), (8, 1, 0.8)]
    assert series(client, run_id, "b") == [(2, 0, 0.2), (4, 0, 0.4), (9, 0, 0.9)]
    assert series(client, run_id, "c") == [(1, 0, 0.1), (3, 0, 0.3)]


def test_nan_and_infinities_are_stored_as_what_they_are(client: TestClient, run_id: int) -> None:
    points = [wire.Point("loss", 1, math.nan), wire.Point("loss", 2, math.inf), wire.Point("loss", 3, -math.inf)]
    assert post(client, run_id, wire.Batch(tuple(points)).to_json()).status_code == 200
    values = [v for _, _, v in series(client, run_id)]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf]


def test_keys_with_slashes_are_their_own_series(client: TestClient, run_id: int) -> None:
    post(client, run_id, batch(1, key="val/loss"))
    assert client.get(f"/api/runs/{run_id}/metrics").json() == ["val/loss"]
    assert len(series(client, run_id, "val/loss")) == 1


def test_progress_moves_a_starting_run_to_running_and_is_shown(client: TestClient, run_id: int) -> None:
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).status = RunStatus.starting
    progress = {"epoch": 2, "epochs": 5, "step": 40, "total_steps": 100, "samples_per_s": 1234.5}
    assert post(client, run_id, {"points": [], "progress": progress}).status_code == 200
    run = client.get(f"/api/runs/{run_id}").json()
    assert (run["status"], run["epoch"], run["step"], run["total_steps"]) == ("running", 2, 40, 100)
    assert run["heartbeat_at"] is not None
    final = {**progress, "step": 100, "samples_per_s": 0.0, "finished": True}  # the trainer's last word has no rate
    post(client, run_id, {"points": [], "progress": final})
    assert client.get(f"/api/runs/{run_id}").json()["samples_per_s"] == 1234.5


@pytest.mark.parametrize(
    ("point", "field"),
    [
        ({"key": "loss", "step": "seven", "value": 1.0}, "step"),
        ({"key": "loss", "step": 1.5, "value": 1.0}, "step"),
        ({"key": "loss", "step": -1, "value": 1.0}, "step"),
        ({"key": "loss", "step": 1, "value": "low"}, "value"),
        ({"key": "loss", "step": 1, "value": [1.0]}, "value"),
        ({"key": "loss", "step": 1, "value": None}, "value"),
        ({"key": "loss", "step": 1, "value": True}, "value"),
        ({"key": "loss", "step": True, "value": 1.0}, "step"),
        ({"key": "loss", "step": "3", "value": 1.0}, "step"),
        ({"key": "", "step": 1, "value": 1.0}, "key"),
        ({"key": "k" * 201, "step": 1, "value": 1.0}, "key"),
        ({"key": "loss", "value": 1.0}, "step"),
        ({"key": "loss", "step": 1, "value": 1.0, "rank": -1}, "rank"),
    ],
)
def test_a_batch_with_one_bad_point_is_refused_whole(client: TestClient, run_id: int, point: dict, field: str) -> None:
    good = {"key": "loss", "step": 1, "value": 1.0}
    response = post(client, run_id, {"points": [good, point]})
    assert response.status_code == 422
    assert next(e["loc"] for e in response.json()["detail"])[-1] == field
    assert series(client, run_id) == []


def test_wrong_or_missing_token_is_401_and_stores_nothing(client: TestClient, run_id: int) -> None:
    assert post(client, run_id, batch(1), token="guess").status_code == 401
    assert client.post(f"/api/runs/{run_id}/metrics", json=batch(1)).status_code == 401
    assert series(client, run_id) == []


def test_unknown_runs_refuse_metrics(client: TestClient) -> None:
    assert post(client, 999, batch(1)).status_code == 404


FINAL = [status for status in RunStatus if status.is_final]


@pytest.mark.parametrize("status", FINAL)
@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_a_launched_runs_token_is_refused_once_the_run_has_ended(
    client: TestClient, run_id: int, launcher: str, status: RunStatus
) -> None:
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.launcher, run.status, run.finished_at = launcher, status, utcnow()
    refused = post(client, run_id, batch(1))
    assert refused.status_code == 409 and "takes no more metrics" in refused.json()["detail"]
    assert series(client, run_id) == []


@pytest.mark.parametrize("status", FINAL)
def test_a_run_launched_elsewhere_takes_its_ranks_late_batches_for_a_minute_after_its_end_then_refuses_them(
    client: TestClient, status: RunStatus
) -> None:
    """A rank still sending when another ended the run is heard out; a token used later is refused (it was taken,
    and stored, for ever before). A run declared lost takes them at any time: its processes were only silent."""
    joined = client.post("/api/runs/external", json={"key": "job-1", "name": "elsewhere", "rank": 0, "world_size": 1,
                                                     "local_world_size": 1, "host": "node-a"}).json()  # fmt: skip
    run_id, token = joined["run_id"], joined["token"]
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.finished_at = status, utcnow()
    assert post(client, run_id, batch(1), token=token).status_code == 200
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.finished_at = status, utcnow() - external.LATE_BATCHES - timedelta(seconds=1)
    late = post(client, run_id, batch(2), token=token)
    if status == RunStatus.lost:
        assert late.status_code == 200 and client.get(f"/api/runs/{run_id}").json()["status"] == "running"
    else:
        assert late.status_code == 409 and "takes no more metrics" in late.json()["detail"]
    assert [step for step, _rank, _value in series(client, run_id)] == [1, 2] if status == RunStatus.lost else [1]


def test_a_metric_the_run_never_reported_is_a_404_naming_it_and_the_runs_metrics(
    client: TestClient, run_id: int
) -> None:
    post(client, run_id, batch(1) | {"columns": [{"key": "lr", "steps": [1], "values": [0.1], "times": [1.0]}]})
    typo = client.get(f"/api/runs/{run_id}/metrics/los")
    assert typo.status_code == 404
    assert typo.json()["detail"] == f"run {run_id} has no metric 'los'; its metrics: loss, lr"
    assert [p["step"] for p in client.get(f"/api/runs/{run_id}/metrics/loss").json()["points"]] == [1]


def test_series_pages_by_step_range(client: TestClient, run_id: int) -> None:
    post(client, run_id, batch(*range(1, 11)))
    first = client.get(f"/api/runs/{run_id}/metrics/loss", params={"limit": 4}).json()
    assert ([p["step"] for p in first["points"]], first["next_step"]) == ([1, 2, 3, 4], 5)
    ranged = client.get(f"/api/runs/{run_id}/metrics/loss", params={"start_step": 5, "end_step": 7}).json()
    assert ([p["step"] for p in ranged["points"]], ranged["next_step"]) == ([5, 6, 7], None)


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 7])
def test_paging_a_series_of_several_ranks_per_step_returns_each_point_once_and_ends(
    client: TestClient, run_id: int, limit: int
) -> None:
    post(client, run_id, ranks_at_each_step(range(1, 6), ranks=3))
    whole = [(step, rank) for step in range(1, 6) for rank in range(3)]
    assert read_all_pages(client, run_id, "rank/step_ms", limit=limit) == whole


def test_a_page_by_step_keeps_a_step_whole_when_it_can(client: TestClient, run_id: int) -> None:
    post(client, run_id, ranks_at_each_step(range(1, 6), ranks=3))
    page = client.get(f"/api/runs/{run_id}/metrics/rank/step_ms", params={"limit": 7}).json()
    assert [(p["step"], p["rank"]) for p in page["points"]] == [(s, r) for s in (1, 2) for r in range(3)]
    assert (page["next_step"], page["next_rank"]) == (3, 0)  # a caller paging by step alone loses nothing


def test_a_starting_run_that_reports_steps_without_progress_becomes_running_at_that_step(
    client: TestClient, run_id: int
) -> None:
    """A script of the user's own reports only `report.log` points: its steps are its progress and its heartbeat."""
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).status = RunStatus.starting
    samples = [
        wire.Point("gpu/node1/0/util", 1_763_700_000, 97.0),
        wire.Point("sys/node1/cpu_percent", 1_763_700_000, 50),
    ]
    post(client, run_id, wire.Batch(tuple(samples)).to_json())  # GPU samples are at step = unix seconds
    run = client.get(f"/api/runs/{run_id}").json()
    assert (run["status"], run["step"], run["heartbeat_at"]) == ("starting", 0, None)

    post(client, run_id, batch(1, 2, 3, 4, 5, 6, 7))
    run = client.get(f"/api/runs/{run_id}").json()
    assert (run["status"], run["step"]) == ("running", 7) and run["heartbeat_at"] is not None
    assert run["events"][-1]["reason"] == "the trainer reported its first step"
    post(client, run_id, wire.Batch(tuple(replace(s, step=s.step + 5) for s in samples)).to_json())
    post(client, run_id, batch(3))  # an older step sent again (a replayed spool) does not move the run back
    assert client.get(f"/api/runs/{run_id}").json()["step"] == 7


def test_progress_never_moves_back(client: TestClient, run_id: int) -> None:
    progress = {"epoch": 2, "epochs": 5, "step": 40, "total_steps": 100, "samples_per_s": 1234.5}
    post(client, run_id, {"points": [], "progress": progress})
    post(client, run_id, {"points": [], "progress": {**progress, "epoch": 1, "step": 30}})  # an older batch, resent
    run = client.get(f"/api/runs/{run_id}").json()
    assert (run["epoch"], run["step"], run["total_steps"]) == (2, 40, 100)


def columns(*columns: wire.Column) -> str:
    """A batch in the compact format, as the client writes it: NaN and infinities bare."""
    return json.dumps(wire.Batch(columns=columns).to_json())


def post_raw(client: TestClient, run_id: int, body: str):  # type: ignore[no-untyped-def]
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    return client.post(f"/api/runs/{run_id}/metrics", content=body, headers=headers)


def test_both_formats_store_the_same_points_nan_and_infinities_included(client: TestClient, run_id: int) -> None:
    values = [0.5, math.nan, math.inf, -math.inf, 1e-300, 2.0]
    steps, ranks = [1, 2, 3, 4, 5, 2**40], (0, 3)
    per_point = tuple(wire.Point("loss", s, v, r, 1.7e9 + s) for r in ranks for s, v in zip(steps, values, strict=True))
    compact = tuple(wire.Column("loss", r, steps, values, [1.7e9 + s for s in steps]) for r in ranks)
    other = int(client.post("/api/runs", json={"name": "compact"}).json()["id"])
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, other).status, db.get(Run, other).token_hash = RunStatus.running, hash_token(TOKEN)
    assert post(client, run_id, wire.Batch(per_point).to_json()).json() == {"accepted": 12, "stored": 12}
    assert post_raw(client, other, columns(*compact)).json() == {"accepted": 12, "stored": 12}
    assert post_raw(client, other, columns(*compact)).json() == {"accepted": 12, "stored": 0}  # a retry
    old, new = series(client, run_id), series(client, other)
    assert [(s, r) for s, r, _ in old] == [(s, r) for s, r, _ in new] and len(old) == 12
    for (_, _, a), (_, _, b) in zip(old, new, strict=True):
        assert a == b or (math.isnan(a) and math.isnan(b))
    # Strings for the non-finite values, as the per-point format writes them, are taken too.
    assert post_raw(client, other, '{"columns": [{"key": "k", "steps": [1], "values": ["NaN"], "times": [0]}]}').json()
    assert math.isnan(series(client, other, "k")[0][2])


@pytest.mark.parametrize(
    ("column", "says"),
    [
        (
            {"key": "loss", "steps": [1, 2, 3], "values": [0.1, 0.2], "times": [0, 0, 0]},
            "equally long (got 3, 2 and 3)",
        ),
        ({"key": "loss", "steps": [1, 2.5], "values": [0.1, 0.2], "times": [0, 0]}, "steps"),
        ({"key": "loss", "steps": [1, 2], "values": [0.1, "fast"], "times": [0, 0]}, "values"),
        ({"key": "loss", "steps": [1, 2], "values": [0.1, True], "times": [0, 0]}, "values"),
        ({"key": "loss", "steps": [1, -2], "values": [0.1, 0.2], "times": [0, 0]}, "steps"),
        ({"key": "", "steps": [1], "values": [0.1], "times": [0]}, "key"),
        ({"key": "loss", "steps": [1], "values": [0.1], "times": [0], "unit": "s"}, "unit"),
    ],
)
def test_a_malformed_column_is_refused_naming_it_and_nothing_is_stored(
    client: TestClient, run_id: int, column: dict, says: str
) -> None:
    good = {"key": "loss", "steps": [7], "values": [0.7], "times": [0]}
    answer = post_raw(client, run_id, json.dumps({"columns": [good, column]}))
    assert answer.status_code == 422
    detail = answer.json()["detail"]
    assert detail[0]["loc"][:3] == ["body", "columns", 1] and says in json.dumps(detail)
    assert series(client, run_id) == []


@pytest.mark.parametrize(
    "body",
    [b"\x80", b'{"columns": [{"key": "lo\xffss", "steps": [1], "values": [1.0], "times": [0]}]}'],
    ids=["a stray byte", "a batch with a key that is not UTF-8"],
)
def test_a_body_that_is_not_utf8_is_refused_as_unreadable_and_nothing_is_stored(
    client: TestClient, run_id: int, body: bytes
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    answer = client.post(f"/api/runs/{run_id}/metrics", content=body, headers=headers)
    assert answer.status_code == 400 and "not UTF-8" in answer.json()["detail"]
    assert client.get(f"/api/runs/{run_id}/metrics").json() == []


def test_a_batch_of_more_points_than_a_batch_holds_is_refused(client: TestClient, run_id: int) -> None:
    steps = list(range(wire.MAX_POINTS_PER_BATCH // 2 + 1))  # two columns, each within bounds, too many together
    halves = [wire.Column(key, 0, steps, [0.0] * len(steps), [0.0] * len(steps)) for key in ("loss", "lr")]
    answer = post_raw(client, run_id, columns(*halves))
    assert answer.status_code == 422 and "a batch holds at most 10000" in answer.text
    assert series(client, run_id) == []


def test_ingest_threads_take_the_nice_they_are_given_and_nothing_else_does(tmp_path: Path) -> None:
    """RANKBOARD_INGEST_NICE=5 more than the server's: the batches are taken on threads at that niceness (they yield a
    shared node's CPU to training); the server's other threads, among them the supervisor's that starts runs, keep the
    niceness the server started with (this process's, 0 unless the tests were started niced)."""
    started = os.getpriority(os.PRIO_PROCESS, 0)
    if started > 14:
        pytest.skip(f"at niceness {started} there is no room for a niceness 5 higher")
    ingest = started + 5
    server = LiveServer(tmp_path, RANKBOARD_INGEST_NICE=str(ingest), RANKBOARD_SUPERVISE_INTERVAL_S="3600")
    server.start()
    try:
        run_id = open_run(server, TOKEN)
        with server.api() as api:
            for step in range(1, 4):  # three batches: more than one thread may take them
                body = {"points": [{"key": "loss", "step": step, "value": 1.0 / step, "time": 1.0}]}
                reply = api.post(f"/api/runs/{run_id}/metrics", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
                assert reply.status_code == 200, reply.text
            assert [p["step"] for p in api.get(f"/api/runs/{run_id}/metrics/loss").json()["points"]] == [1, 2, 3]
        assert server.process is not None
        pid = server.process.pid
        niceness = {int(task.name): thread_nice(task) for task in Path(f"/proc/{pid}/task").iterdir()}
    finally:
        server.stop()
    assert ingest in niceness.values() and niceness[pid] == started  # the main thread's id is the process's
    assert sorted(set(niceness.values())) == [started, ingest]


def test_the_access_log_leaves_out_accepted_batches_and_keeps_refused_ones(tmp_path: Path) -> None:
    """Every rank of every run posts a batch every second or two: those lines would bury a person's requests."""
    server = LiveServer(tmp_path, RANKBOARD_SUPERVISE_INTERVAL_S="3600")
    server.start()
    try:
        run_id = open_run(server, TOKEN)
        path, body = wire.INGEST_PATH.format(run_id=run_id), {"points": [{"key": "loss", "step": 1, "value": 1.0}]}
        with server.api() as api:
            assert api.post(path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
            assert api.post(path, json=body, headers={"Authorization": "Bearer not-the-token"}).status_code == 401
            assert api.get(f"/api/runs/{run_id}/metrics/loss").status_code == 200
    finally:
        server.stop()
    log = (tmp_path / "server.log").read_text()
    assert f'"POST {path} HTTP/1.1" 401' in log and f'"GET {path}/loss HTTP/1.1" 200' in log, log
    assert f'"POST {path} HTTP/1.1" 200' not in log, log


def thread_nice(task: Path) -> int:
    return int((task / "stat").read_text().rpartition(")")[2].split()[16])  # the field after the command's name
