"""The metrics client against the real server: nothing lost, nothing twice, never in the training loop's way."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rankboard import report, wire
from rankboard.report import Reporter

from tests.live import LiveServer, free_port, open_run, points, set_run, wait_for

TOKEN = "client-token"


def reporter_for(server: LiveServer, run_id: int, spool: Path, **options: float) -> Reporter:
    return Reporter(server.url, str(run_id), TOKEN, spool, flush_interval=0.02, **options)  # type: ignore[arg-type]


def stored(server: LiveServer, run_id: int, key: str = "loss") -> list[tuple[int, float]]:
    with server.api() as api:
        return [(p["step"], p["value"]) for p in points(api, run_id, key)]


def losses(steps: range) -> list[tuple[int, float]]:
    return [(step, step / 7) for step in steps]


def test_log_returns_at_once_and_close_spools_every_point_in_order(tmp_path: Path) -> None:
    reporter = Reporter(f"http://127.0.0.1:{free_port()}", "1", TOKEN, tmp_path, rank=1, flush_interval=0.01,
                        max_batch=500)  # fmt: skip
    started = time.perf_counter()
    for step in range(20_000):
        reporter.log({"loss": step / 7, "lr": 1e-3}, step=step)
    assert time.perf_counter() - started < 1.0  # 40,000 points, and the closed port is never waited on
    reporter.log({"note": "not a number"}, step=0)  # type: ignore[dict-item]  # skipped with a warning, not raised
    reporter.close()
    reporter.close()  # idempotent
    assert reporter.spool_path.name == f"spool-{socket.gethostname()}-rank1.jsonl"
    lines = reporter.spool_path.read_text().splitlines()
    columns = [column for line in lines for column in json.loads(line)["columns"]]
    for key in ("loss", "lr"):  # each metric's steps in the order logged, each once
        assert [step for c in columns if c["key"] == key for step in c["steps"]] == list(range(20_000))
    assert {c["rank"] for c in columns} == {1}


def test_points_and_progress_reach_the_server(server: LiveServer, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN)
    reporter = reporter_for(server, run_id, tmp_path)
    reporter.progress(wire.Progress(epoch=1, epochs=2, step=3, total_steps=10, samples_per_s=99.0))
    for step in range(1, 4):
        reporter.log({"loss": step / 7, "lr": 1e-3}, step=step)
    reporter.close()
    assert stored(server, run_id) == losses(range(1, 4))
    assert stored(server, run_id, "lr") == [(1, 1e-3), (2, 1e-3), (3, 1e-3)]
    with server.api() as api:
        run = api.get(f"/api/runs/{run_id}").json()
    assert (run["step"], run["total_steps"], run["samples_per_s"]) == (3, 10, 99.0)
    assert not reporter.spool_path.exists()


def batches_taken(server: LiveServer) -> float:
    with server.api() as api:
        scraped = text_string_to_metric_families(api.get("/metrics").text)
    return next(f.samples[0].value for f in scraped if f.name == "rankboard_ingest_batches")


def test_a_loop_that_logs_every_step_gets_one_post_a_flush_interval(server: LiveServer, tmp_path: Path) -> None:
    """A reporter that chased the loop with one post after another, each of a few steps' points (430 in a 1,024-step
    mlp run where one a tick makes 6), made that run 8% slower."""
    run_id = open_run(server, TOKEN)
    before = batches_taken(server)
    reporter = Reporter(server.url, str(run_id), TOKEN, tmp_path, flush_interval=0.25)
    steps = train_for(reporter, 1.5)
    assert stored(server, run_id) == losses(range(1, steps + 1))  # every point, once
    assert batches_taken(server) - before <= 1.5 / 0.25 + 3  # a tick's, a wake's and close()'s, not one a few steps


def train_for(reporter: Reporter, seconds: float) -> int:
    """A loop at ~500 steps/s, logging 4 metrics a step, for `seconds`; closes the reporter, returns the steps."""
    deadline, step = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        step += 1
        reporter.log({"loss": step / 7, "lr": 1e-3, "grad_norm": 1.0, "samples_per_s": 1.0}, step=step)
        time.sleep(0.002)
    reporter.close()
    return step


@pytest.mark.parametrize(("every", "seconds", "fewest", "most"), [("0.25", 1.5, 4, 9), ("5", 2.2, 1, 2)])
def test_the_launchers_environment_sets_how_often_a_rank_posts(
    server: LiveServer, tmp_path: Path, every: str, seconds: float, fewest: int, most: int
) -> None:
    """RANKBOARD_REPORT_S, which a server's launchers pass on to every rank: where training shares a node with the
    server, posting less often leaves training more of the CPU. Once a second (the default) would post 3 times in
    2.2 s, and 2 or 3 times in 1.5 s."""
    run_id = open_run(server, TOKEN)
    before = batches_taken(server)
    environ = {wire.ENV_RUN_ID: str(run_id), wire.ENV_SERVER_URL: server.url, wire.ENV_TOKEN: TOKEN,
               wire.ENV_RUN_DIR: str(tmp_path), report.ENV_REPORT_S: every}  # fmt: skip
    reporter = Reporter.from_env(environ)
    assert reporter is not None
    steps = train_for(reporter, seconds)
    assert stored(server, run_id) == losses(range(1, steps + 1))
    assert fewest <= batches_taken(server) - before <= most  # the ticks' posts and close()'s


def test_a_report_interval_outside_its_range_or_not_a_number_is_brought_back_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert report.report_interval({}) == report.DEFAULT_REPORT_S == 1.0
    assert report.report_interval({report.ENV_REPORT_S: "5"}) == 5.0
    assert capsys.readouterr().err == ""
    cases = {"0.01": 0.25, "60": 10.0, "often": 1.0, "nan": 1.0}
    assert {raw: report.report_interval({report.ENV_REPORT_S: raw}) for raw in cases} == cases
    assert capsys.readouterr().err.splitlines() == [
        "rankboard: RANKBOARD_REPORT_S=0.01 is outside 0.25 to 10 s; posting every 0.25 s",
        "rankboard: RANKBOARD_REPORT_S=60 is outside 0.25 to 10 s; posting every 10 s",
        "rankboard: RANKBOARD_REPORT_S='often' is not a number; posting every 1 s",
        "rankboard: RANKBOARD_REPORT_S='nan' is not a number; posting every 1 s",
    ]


def test_a_heartbeat_comes_when_there_are_no_points(server: LiveServer, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN)
    reporter = reporter_for(server, run_id, tmp_path, heartbeat_interval=0.1)
    reporter.progress(wire.Progress(epoch=1, epochs=1, step=0, total_steps=5))

    def heartbeat() -> str | None:
        with server.api() as api:
            return api.get(f"/api/runs/{run_id}").json()["heartbeat_at"]  # type: ignore[no-any-return]

    first = wait_for(heartbeat, 10, what="a heartbeat")
    wait_for(lambda: heartbeat() != first, 10, what="a second heartbeat")
    reporter.close()


def test_while_the_server_is_down_points_wait_in_the_spool_and_arrive_once_in_order(
    server: LiveServer, tmp_path: Path
) -> None:
    run_id = open_run(server, TOKEN)
    server.stop()
    reporter = reporter_for(server, run_id, tmp_path, max_batch=50)
    for step in range(300):
        reporter.log({"loss": step / 7}, step=step)
    wait_for(reporter.spool_path.exists, 10, what="the spool")
    server.start()
    wait_for(lambda: not reporter.spool_path.exists(), 30, what="the spool to be sent")
    reporter.log({"loss": 300 / 7}, step=300)
    reporter.close()
    assert stored(server, run_id) == losses(range(301))


def test_a_restarted_trainer_sends_the_spool_its_predecessor_left(server: LiveServer, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN)
    crashed = Reporter(f"http://127.0.0.1:{free_port()}", str(run_id), TOKEN, tmp_path, flush_interval=0.02)
    crashed.log({"loss": 1 / 7}, step=1)
    crashed.close()
    with crashed.spool_path.open("ab") as spool:
        spool.write(b'{"points": [{"key": "lo')  # the process died while writing a line
    restarted = reporter_for(server, run_id, tmp_path)
    restarted.log({"loss": 1 / 7}, step=1)  # the same step again after the restart: stored once
    restarted.log({"loss": 2 / 7}, step=2)
    restarted.close()
    assert stored(server, run_id) == losses(range(1, 3))
    assert not restarted.spool_path.exists()


def test_once_the_server_says_the_run_is_over_nothing_more_is_sent(server: LiveServer, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN, status="succeeded")
    reporter = reporter_for(server, run_id, tmp_path)
    reporter.log({"loss": 1.0}, step=1)
    wait_for(lambda: reporter._run_over, 10, what="the client to hear 409")
    set_run(server, run_id, status="running")
    reporter.log({"loss": 2.0}, step=2)
    reporter.close()
    assert stored(server, run_id) == [] and not reporter.spool_path.exists()


def test_a_wrong_token_is_refused_and_the_run_keeps_nothing(server: LiveServer, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN)
    reporter = Reporter(server.url, str(run_id), "not-the-token", tmp_path, flush_interval=0.02)
    reporter.log({"loss": 1.0}, step=1)
    reporter.close()
    assert stored(server, run_id) == []
    with pytest.raises(httpx.HTTPStatusError):
        httpx.post(f"{server.url}/api/runs/{run_id}/metrics", json={"points": []}).raise_for_status()


def test_finished_leaves_the_marker_the_dashboard_judges_a_script_by(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script's `report.finished()` is what the built-in trainer's marker is: training completed, whatever
    torchrun's exit code says afterwards (gloo's rare abort at exit)."""
    from rankboard import report

    from app.services.lifecycle.tick import final_status

    monkeypatch.delenv(wire.ENV_RUN_DIR, raising=False)
    report.finished()  # outside a run: nothing, anywhere
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv(wire.ENV_RUN_DIR, str(tmp_path))
    report.finished()
    assert [p.name for p in tmp_path.iterdir()] == [wire.FINISHED_MARKER]  # whole: no temporary file left
    assert json.loads((tmp_path / wire.FINISHED_MARKER).read_text())["finished_at"] <= time.time()
    finished = (tmp_path / wire.FINISHED_MARKER).exists()
    status, _ = final_status(exit_code=1, stop_requested=False, trainer_finished=finished)
    assert status.value == "succeeded"


def test_each_worker_leaves_its_ranks_beside_torchruns_error_file(tmp_path: Path) -> None:
    """The marker that labels a multi-node run's log folders: written whole, only inside a dashboard run under
    torchrun's --log-dir, and a failure to write it never reaches the training."""
    from rankboard import report

    worker = tmp_path / "41_x1" / "attempt_0" / "0"
    worker.mkdir(parents=True)
    env = {"TORCHELASTIC_ERROR_FILE": str(worker / "error.json"), "RANK": "3", "LOCAL_RANK": "0", "GROUP_RANK": "1"}
    assert report.leave_rank_marker(env) is None  # not a dashboard run: nothing is written
    assert report.leave_rank_marker({wire.ENV_RUN_ID: "7", "RANK": "3"}) is None  # no --log-dir, nowhere to write
    assert list(worker.iterdir()) == []

    marker = report.leave_rank_marker({**env, wire.ENV_RUN_ID: "7"})
    assert marker == worker / wire.RANK_MARKER and [p.name for p in worker.iterdir()] == [wire.RANK_MARKER]
    assert json.loads(marker.read_text()) == {"rank": 3, "local_rank": 0, "group_rank": 1, "node": socket.gethostname()}

    gone = {**env, wire.ENV_RUN_ID: "7", "TORCHELASTIC_ERROR_FILE": str(tmp_path / "no such folder" / "error.json")}
    assert report.leave_rank_marker(gone) is None
    assert report.leave_rank_marker({**env, wire.ENV_RUN_ID: "7", "RANK": "three"}) is None


def test_a_spool_an_older_client_wrote_point_by_point_is_replayed(server: LiveServer, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN)
    spool = tmp_path / f"spool-{socket.gethostname()}-rank0.jsonl"
    old = wire.Batch(tuple(wire.Point("loss", step, step / 7, 0, 1.7e9) for step in range(1, 4)))
    spool.write_text(json.dumps(old.to_json(), allow_nan=False) + "\n")  # one object per point, as clients once wrote
    reporter = reporter_for(server, run_id, tmp_path)
    reporter.log({"loss": 4 / 7}, step=4)
    reporter.close()
    assert stored(server, run_id) == losses(range(1, 5)) and not spool.exists()
