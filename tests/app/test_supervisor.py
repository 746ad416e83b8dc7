"""The supervisor's tick: how a run ends is decided from its exit record, its marker, and whether a stop was asked."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from rankboard import wire
from rankboard.report import Reporter
from sqlalchemy.orm import Session

from app.core.db import make_engine
from app.core.models import Alert, Run, RunStatus, utcnow
from app.core.settings import Settings
from app.launcher import processes
from app.main import create_app
from app.services import runs as runs_service
from app.services.lifecycle.tick import ACTIVE, NO_REPORTS, final_status
from app.store import queue as queue_store
from app.store.runs import runs_to_supervise
from tests.live import free_port, run_processes, wait_for


def run_dir(client: TestClient, run_id: int):  # type: ignore[no-untyped-def]
    folder = client.app.state.settings.shared / "logs" / f"run-{run_id}"  # type: ignore[attr-defined]
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def started_run(client: TestClient) -> int:
    """A run recorded as running, its process being this test process."""
    run_id = int(client.post("/api/runs", json={}).json()["id"])
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.pid, run.pid_start_ticks = RunStatus.running, os.getpid(), processes.start_ticks(os.getpid())
    return run_id


def tick(client: TestClient) -> dict:
    client.app.state.supervisor.tick()  # type: ignore[attr-defined]
    return client.get("/api/runs/1").json()  # type: ignore[no-any-return]


def test_a_tick_reads_the_live_runs_as_objects_and_this_hosts_queue_only_as_rows(client: TestClient) -> None:
    """Of the queued runs, only those of another scheduler (Slurm's, to submit or waiting in its queue) and a resumed
    run with an alert still open (to clear) are loaded as objects; this host's queue is read as rows for the queue's
    decision (priorities and limits reach past its head), and only the runs it starts are loaded. So a tick's CPU,
    taken from training twice a second, stays small however long the queue grows (bench/queue_tick.py)."""
    running = started_run(client)
    queued = [int(client.post("/api/runs", json={}).json()["id"]) for _ in range(8)]
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, queued[5]).launcher = "slurm"
        db.add(Alert(run_id=queued[6], condition="failed", message="failed; since resumed"))
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        read = [run.id for run in runs_to_supervise(db, active=ACTIVE, host=["local"])]
        rows = sorted(row[0] for row in queue_store.waiting(db, launchers=["local"]))
    assert read == [running, queued[5], queued[6]]
    assert rows == [run_id for run_id in queued if run_id != queued[5]]


def test_a_run_stopped_while_queued_is_not_started_by_a_tick_that_read_it_before(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop that lands between the tick's read of the queue and its launch: the run stays stopped, no torchrun
    starts. (A resumed run stopped at once was started all the same, and ran to its end: seen in CI.)"""
    run_id = int(client.post("/api/runs", json={}).json()["id"])
    launcher = client.app.state.launchers.local  # type: ignore[attr-defined]
    stopped: list[str] = []
    # The tick asks the launchers to refresh their view of the runs it read; the stop comes then, committed.
    monkeypatch.setattr(
        launcher, "refresh", lambda runs: stopped.append(client.post(f"/api/runs/{run_id}/stop").json()["status"])
    )
    run = tick(client)
    launched = run_processes(client.app.state.settings.shared.parent)  # type: ignore[attr-defined]
    processes.kill_all(launched)
    assert stopped == ["stopped"]
    assert (run["status"], run["status_reason"], launched) == ("stopped", "stopped before it started", [])


def test_a_stop_that_read_the_run_queued_before_a_tick_started_it_stops_the_started_run(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: the stop read the run queued, then the tick launched it. The stop must see the launch and
    end its processes, not mark the run stopped and leave them training."""
    run_id = int(client.post("/api/runs", json={"epochs": 100, "nproc_per_node": 1}).json()["id"])
    read_run = runs_service.get_run

    def read_then_tick(db: Session, *, run_id: int) -> Run:
        run = read_run(db, run_id=run_id)
        client.app.state.supervisor.tick()  # type: ignore[attr-defined]
        return run

    monkeypatch.setattr(runs_service, "get_run", read_then_tick)
    answer = client.post(f"/api/runs/{run_id}/stop").json()
    monkeypatch.undo()
    shared = client.app.state.settings.shared  # type: ignore[attr-defined]
    try:
        assert answer["status"] == "stopping", answer["status_reason"]
        wait_for(lambda: not run_processes(shared.parent), 60, what="the started run's processes to end")
    finally:
        processes.kill_all(run_processes(shared.parent))
    # The waiter records torchrun's exit a moment after its processes are gone: a loaded machine ticked in between.
    wait_for(lambda: tick(client)["status"] == "stopped", 30, what="the run to end stopped")


def test_a_live_run_without_an_exit_record_stays_running(client: TestClient) -> None:
    started_run(client)
    assert tick(client)["status"] == "running"


def test_points_spooled_while_the_server_was_away_are_stored_when_the_run_ends(client: TestClient) -> None:
    run_id = started_run(client)
    folder = run_dir(client, run_id)
    batches = [wire.Batch(tuple(wire.Point("loss", s, 1 / s) for s in steps)) for steps in ([1, 2], [3])]
    spool_text = "".join(json.dumps(b.to_json()) + "\n" for b in batches) + '{"points": [{"ke'  # a cut-off last line
    (folder / "spool-node1-rank0.jsonl").write_text(spool_text)
    (folder / wire.FINISHED_MARKER).write_text("{}")
    (folder / "exit.json").write_text(json.dumps({"exit_code": 0}))

    run = tick(client)
    assert run["status"] == "succeeded" and "3 points the trainer could not send were recovered" in run["status_reason"]
    steps = [p["step"] for p in client.get(f"/api/runs/{run_id}/metrics/loss").json()["points"]]
    assert steps == [1, 2, 3] and run["final_loss"] == pytest.approx(1 / 3)
    assert not (folder / "spool-node1-rank0.jsonl").exists()


def test_a_run_that_failed_to_write_a_checkpoint_says_why(client: TestClient) -> None:
    run_id = started_run(client)
    folder = run_dir(client, run_id)
    rank0 = folder / "ranks" / "abc_1" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    (rank0 / "stdout.log").write_text(
        "[rank 0] saved step-00000128.pt\n[rank 0] checkpoint step-00000256.pt NOT written: No space left on device"
        " (ENOSPC); the previous checkpoint step-00000128.pt is intact\n"
    )
    (folder / "exit.json").write_text(json.dumps({"exit_code": 1}))
    run = tick(client)
    assert run["status"] == "failed"
    assert run["status_reason"].endswith(
        "checkpoint step-00000256.pt NOT written: No space left on device (ENOSPC); the previous checkpoint "
        "step-00000128.pt is intact"
    )


def test_a_run_whose_processes_vanished_without_an_exit_record_is_lost(client: TestClient) -> None:
    started_run(client)
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, 1).pid_start_ticks = 1  # the pid now names another process than the one started
    run = tick(client)
    assert run["status"] == "lost" and "disappeared" in run["status_reason"]
    assert [e["status"] for e in run["events"]][-1] == "lost"


def test_the_first_answer_of_a_restarted_server_already_shows_a_run_that_vanished_while_it_was_away_as_lost(
    settings: Settings,
) -> None:
    # As the last server left it: running, its pid now another process's. Stored before this server starts.
    engine = make_engine(settings.sqlalchemy_url)
    with Session(engine) as db, db.begin():
        db.add(Run(name="left", workload="mlp", nproc_per_node=1, status=RunStatus.running, status_reason="",
                   pid=os.getpid(), pid_start_ticks=1, started_at=utcnow()))  # fmt: skip
    engine.dispose()
    with TestClient(create_app(settings)) as client:
        run = client.get("/api/runs/1").json()
    assert run["status"] == "lost" and "disappeared" in run["status_reason"]


@pytest.mark.parametrize(
    ("exit_code", "stop_requested", "trainer_finished", "status", "reason"),
    [
        (0, False, True, RunStatus.succeeded, "training finished"),
        # gloo's rare abort after the last step: the marker decides
        (1, False, True, RunStatus.succeeded, "training finished (torchrun then exited with 1)"),
        (1, True, False, RunStatus.stopped, "stopped on request"),  # torchrun exits 1 after passing SIGTERM on
        (None, True, False, RunStatus.stopped,
         "stopped on request; its processes did not end within the grace period and were killed"),
        (1, False, False, RunStatus.failed, "torchrun exited with 1 before training finished; see the ranks' output"),
        (0, False, False, RunStatus.succeeded, "torchrun exited with 0"),  # a user's own script writes no marker
        (None, False, False, RunStatus.lost, "the run's processes disappeared without recording an exit code"),
    ],
)  # fmt: skip
def test_final_status(
    exit_code: int | None, stop_requested: bool, trainer_finished: bool, status: RunStatus, reason: str
) -> None:
    """How a run ended, in words that read as what happened: a graceful stop is no error (torchrun's exit 1 then)."""
    assert final_status(exit_code=exit_code, stop_requested=stop_requested, trainer_finished=trainer_finished) == (
        status,
        reason,
    )


def test_a_run_that_ended_while_the_server_was_away_shows_the_progress_its_trainer_spooled(client: TestClient) -> None:
    run_id = started_run(client)
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)  # where the server last saw it, half-way, before it went away
        run.epoch, run.step, run.total_steps, run.samples_per_s = 1, 1026, 2048, 300.0
    folder = run_dir(client, run_id)
    # The real client with no server listening: it spools every batch, each with its progress, as the trainer's does.
    reporter = Reporter(f"http://127.0.0.1:{free_port()}", str(run_id), "token", folder, flush_interval=0.01)
    for step in range(1027, 2049):
        reporter.log({"loss": 1 / step}, step=step)
        reporter.progress(wire.Progress(epoch=step // 1024, epochs=2, step=step, total_steps=2048, samples_per_s=500.0))
        if step == 1500:  # let a batch with a measured rate go out, as one would while training
            wait_for(reporter.spool_path.exists, 10, interval=0.01, what="the first spooled batch")
    reporter.progress(wire.Progress(epoch=2, epochs=2, step=2048, total_steps=2048, finished=True))
    reporter.close()
    assert reporter.spool_path.exists()
    (folder / wire.FINISHED_MARKER).write_text("{}")
    (folder / "exit.json").write_text(json.dumps({"exit_code": 0}))

    run = tick(client)
    assert (
        run["status"] == "succeeded" and "1022 points the trainer could not send were recovered" in run["status_reason"]
    )
    assert (run["epoch"], run["step"], run["total_steps"], run["samples_per_s"]) == (2, 2048, 2048, 500.0)
    assert run["final_loss"] == pytest.approx(1 / 2048)


@pytest.mark.parametrize(("workload", "made", "status"), [
    ("script", timedelta(seconds=1), "running"),  # its ranks' log folders, made this launch: its processes are up
    ("script", -timedelta(hours=1), "starting"),  # folders of an earlier launch of the run say nothing of this one
    ("mlp", timedelta(seconds=1), "starting"),  # the built-in trainer reports: it is running at its first report
])  # fmt: skip
def test_a_script_that_reports_nothing_is_running_once_its_processes_are_up(
    client: TestClient, workload: str, made: timedelta, status: str
) -> None:
    run_id = started_run(client)
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.workload, run.started_at = RunStatus.starting, workload, utcnow() - timedelta(minutes=5)
        run.script = "silent.py" if workload == "script" else None
    worker = run_dir(client, run_id) / "ranks" / "rdzv_1" / "attempt_0" / "0"
    worker.mkdir(parents=True)
    stamp = (utcnow() - timedelta(minutes=5) + made).timestamp()
    os.utime(worker, (stamp, stamp))
    shown = tick(client)
    assert shown["status"] == status
    if status == "running":
        assert shown["status_reason"] == NO_REPORTS
