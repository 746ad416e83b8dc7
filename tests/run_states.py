"""A store holding one run in each state a user meets, as the launcher, the trainer and the supervisor leave it,
for the walks over every page (tests/app/test_walk.py, tests/e2e/test_walk_browser.py).

Runs go in through the real ingest endpoint (metrics, heartbeats, progress, GPU inventory) and the real resume
endpoint; what only a process could do (start, die, be told to stop) is written into the database, and the files a
run leaves (a checkpoint and its sidecar, each rank's logs, torchrun's own log) into the shared folder. The live runs'
process is this one, so a supervisor finds them alive and leaves them alone; their launch id is None, so it never
signals anything; they hold every process slot, so the queued runs wait.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import torch
from rankboard import wire
from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from app.auth.passwords import sha256 as hash_token
from app.core.models import Run, RunRank, RunStatus, utcnow
from app.launcher import processes
from app.launcher.local import LAUNCH_MARKER, LAUNCHER_LOG
from app.schemas.runs import RunCreate
from app.services.lifecycle import transitions

TOKEN = "walk-t0ken"
HOST = "node-a"
STEPS, TOTAL_STEPS = 40, 100
SLOTS = [0, 1]  # every slot of a 2-slot server: held by the live runs
Sessions = Callable[[], Session]

# Each state: the status it is stored with, and a sentence its page shows (from its newest lifecycle event).
STATES: dict[str, tuple[RunStatus, str]] = {
    "queued": (RunStatus.queued, "created; waiting for free process slots"),
    "queued in Slurm": (RunStatus.queued, "Slurm job 4242: queued in Slurm (Resources)"),
    "starting": (RunStatus.starting, "torchrun started"),
    "running": (RunStatus.running, "the trainer reported its first progress"),
    "stopping": (RunStatus.stopping, "stop requested: finishing the step, saving"),
    "succeeded": (RunStatus.succeeded, "training finished"),
    "failed": (RunStatus.failed, "torchrun exited with 1 before training finished"),
    "stopped": (RunStatus.stopped, "stopped on request"),
    "lost": (RunStatus.lost, "the run's processes disappeared without recording an exit code"),
    "not progressing": (RunStatus.running, "not progressing: no rank has reported a new step"),
    "restarted": (RunStatus.running, "restart 1 of 3: local rank 1 (pid 4242) was killed by SIGKILL"),
    "resumed": (RunStatus.queued, "resume requested: continues from"),
    "script": (RunStatus.running, "the trainer reported its first step"),
    "launched elsewhere": (RunStatus.running, "launched elsewhere (torchrun:walk-job)"),
}
ELSEWHERE = "launched elsewhere"  # its own torchrun, reporting in: no process, log or checkpoint of the server's
SCRIPT = "script"  # the user's own script, launched by the server: it logs, and reports no epoch, total or rate
SCRIPT_FILE = "scripts/walk_train.py"  # in the shared folder
WAITING = ("queued", "queued in Slurm")  # nothing started: no process, no log, no metric
UNSTARTED = (*WAITING, "starting")  # no metrics and no checkpoint yet; a starting run's logs are still empty
STALE = timedelta(minutes=30)  # the not-progressing run's heartbeats: older than any stall_after_s a test uses


@dataclass(frozen=True)
class Seeded:
    """One run of the store: what a page about it must show, and what it has to ask about."""

    state: str
    id: int
    name: str
    status: RunStatus
    says: str
    checkpoint: str | None = None  # its file name
    checkpoint_path: str | None = None  # relative to the shared folder, as the pages link it
    has_logs: bool = False

    @property
    def live(self) -> bool:
        return self.status.has_process


def seed_states(
    api: httpx.Client, sessions: Sessions, shared: Path, states: Iterable[str] = tuple(STATES)
) -> dict[str, Seeded]:
    """One run per state (of STATES); the restart and not-progressing events come from the supervisor's next tick."""
    seeded = _create(sessions, [state for state in states if state != ELSEWHERE], shared)
    for run in seeded.values():
        if run.state not in UNSTARTED:
            _report(api, run.id, script=run.state == SCRIPT)
        if run.state == "failed":
            _nonfinite(api, run.id)
        if run.state == "stopped":  # rank 1's replica drifted, seen at the fingerprint of step 40
            _post(api, run.id, [wire.Point(wire.DIVERGENCE_KEY, STEPS, 1e-3, 1, 1.7e9)])
        if run.state not in WAITING:
            seeded[run.state] = _leave_files(run, shared)
    if ELSEWHERE in states:
        seeded[ELSEWHERE] = _join_elsewhere(api)
    _settle(sessions, seeded)
    if "running" in seeded:
        _dump(api, seeded["running"].id)
    if "resumed" in seeded:
        assert api.post(f"/api/runs/{seeded['resumed'].id}/resume").status_code == 202
    return seeded


def _create(sessions: Sessions, states: Iterable[str], shared: Path) -> dict[str, Seeded]:
    """The runs, each as the launcher leaves it once torchrun is up (the queued one still waiting)."""
    me, now = os.getpid(), utcnow()
    seeded = {}
    with sessions() as db, db.begin():
        for state in states:
            status, says = STATES[state]
            spec = _script_spec(shared) if state == SCRIPT else RunCreate(
                name=f"walk {state}", epochs=5, max_restarts=3 if state == "restarted" else 0,
                launcher="slurm" if state == "queued in Slurm" else "local")  # fmt: skip
            # As services.runs.create_run stores it: its columns, and its options (a script's: its arguments).
            run = Run(**spec.columns(), config=spec.config(), status=RunStatus.queued, status_reason="")
            db.add(run)
            db.flush()
            transitions.move(db, run, RunStatus.queued, "created; waiting for free process slots")
            if state == "queued in Slurm":  # submitted; its job waits for nodes
                run.started_at, run.token_hash, run.attempt = now, hash_token(TOKEN), 1
                run.job_id, run.job_state, run.job_reason = "4242", "PENDING", "Resources"
                transitions.move(db, run, RunStatus.queued, says)
            elif state != "queued":
                run.started_at, run.devices, run.token_hash = now, SLOTS, hash_token(TOKEN)
                run.pid, run.pid_start_ticks = me, processes.start_ticks(me)
                transitions.move(db, run, RunStatus.starting, f"torchrun started (pid {me}) on 2 CPU process slots")
            seeded[state] = Seeded(state, run.id, run.name, status, says)
    return seeded


def _script_spec(shared: Path) -> RunCreate:
    """A run of the user's own script (in the shared folder, with its arguments), as the server stores it."""
    script = shared / SCRIPT_FILE
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("from rankboard import report\n")
    spec = RunCreate(name=f"walk {SCRIPT}", script=SCRIPT_FILE, script_args=["--lr", "3e-4", "--epochs", "2"])
    return spec.model_copy(update={"script": str(script), "workload": "script"})


def _join_elsewhere(api: httpx.Client) -> Seeded:
    """A 2-rank job started by the user's own torchrun: both processes join through the API, and report."""
    job = {"key": "torchrun:walk-job", "name": f"walk {ELSEWHERE}", "world_size": 2, "local_world_size": 2,
           "host": HOST, "takes_stop": True, "config": {"lr": 3e-4, "model": "llama-7b"}}  # fmt: skip
    joined = [api.post("/api/runs/external", json={**job, "rank": rank}).json() for rank in (0, 1)]
    _report(api, joined[0]["run_id"], token=joined[0]["token"])
    status, says = STATES[ELSEWHERE]
    return Seeded(ELSEWHERE, joined[0]["run_id"], f"walk {ELSEWHERE}", status, says)


def _report(api: httpx.Client, run_id: int, token: str = TOKEN, *, script: bool = False) -> None:
    """What a 2-rank trainer on a 2-GPU node sends: losses, rates, each rank's step time, GPU samples, heartbeats. A
    script's (`script`) logs its points a step a second, and says nothing of its epoch, total or samples a second."""
    logged = ("loss", "lr") if script else ("loss", "samples_per_s", "lr")
    values = {"loss": lambda step: 2.0 / step, "samples_per_s": lambda step: 800.0 + step, "lr": lambda step: 1e-3}
    points = [wire.Point(key, step, values[key](step), 0, 1.7e9 + step)
              for step in range(1, STEPS + 1) for key in logged]  # fmt: skip
    points += [wire.Point("val_loss", step, 2.5 / step, 0, 1.7e9) for step in range(10, STEPS + 1, 10)]
    points += [wire.Point("rank/step_ms", step, 20.0 + rank, rank, 1.7e9) for step in range(1, STEPS + 1)
               for rank in (0, 1)]  # fmt: skip
    # Rank 1 waits 15 ms a step for its data, rank 0 1 ms: a straggler from the first report on.
    points += [wire.Point(key, step, value, rank, 1.7e9 + step) for step in range(1, STEPS + 1) for rank in (0, 1)
               for key, value in (("rank/data_ms", 15.0 if rank else 1.0), ("rank/compute_ms", 6.0))]  # fmt: skip
    now = int(time.time())
    samples = {"util": 97.0, "mem_used": 30e9, "mem_total": 80e9, "temp": 61.0, "power": 520.0,
               "power_limit": 700.0, "sm_clock": 1980.0, "run_mem": 29e9}  # fmt: skip
    points += [wire.Point(wire.GPU_KEY.format(host=HOST, index=gpu, field=field), now - ago, value, gpu, now - ago)
               for ago in range(20, 0, -2) for gpu in (0, 1) for field, value in samples.items()]  # fmt: skip
    node = wire.Node(HOST, tuple(wire.Gpu(i, f"GPU-{i}0000000-walk", "NVIDIA H100 80GB HBM3") for i in (0, 1)))
    progress = None if script else wire.Progress(epoch=2, epochs=5, step=STEPS, total_steps=TOTAL_STEPS,
                                                 samples_per_s=812.5)  # fmt: skip
    batches = [wire.Batch(tuple(points), progress, node)]
    batches += [wire.Batch(heartbeat=wire.Heartbeat(rank, HOST, STEPS - rank)) for rank in (0, 1)]
    for batch in batches:
        answer = api.post(f"/api/runs/{run_id}/metrics", json=batch.to_json(),
                          headers={"Authorization": f"Bearer {token}"})  # fmt: skip
        assert answer.status_code == 200, answer.text


def _dump(api: httpx.Client, run_id: int) -> None:
    """A dump asked for and answered by both ranks, as their clients answer it: rank 1 stuck in its data loading,
    one all_reduce behind rank 0, which waits in it."""
    request = api.post(f"/api/runs/{run_id}/dumps").json()["request"]
    torch_c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    train = wire.Frame("/shared/train.py", 80, "train")
    loading = wire.Frame("/shared/data.py", 88, "__next__")
    stacks = {0: (wire.Frame(torch_c10d, 3252, "all_reduce"), train), 1: (loading, train)}
    for rank, stack in stacks.items():
        collectives = tuple(wire.Collective(seq, "gloo:all_reduce", "[[3]]") for seq in range(1, 7 - rank))
        dump = wire.RankDump(request, rank, HOST, 4200 + rank, 1.7e9, stack, "Thread 0x00007f (most recent call "
                             "first):\n  File ...", collectives)  # fmt: skip
        answer = api.post(f"/api/runs/{run_id}/dumps/{request}", json=dump.to_json(),
                          headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert answer.status_code == 204, answer.text


def _nonfinite(api: httpx.Client, run_id: int) -> None:
    """What the trainer reports of the first non-finite values: the gradient norm inf at step 39, rank 1's loss NaN
    at step 40 (as the failed run's traceback says)."""
    points = [wire.Point(wire.NONFINITE_GRAD_NORM_KEY, STEPS - 1, math.inf, 0, 1.7e9),
              wire.Point(wire.NONFINITE_LOSS_KEY, STEPS, math.nan, 1, 1.7e9)]  # fmt: skip
    _post(api, run_id, points)


def _post(api: httpx.Client, run_id: int, points: list[wire.Point]) -> None:
    answer = api.post(f"/api/runs/{run_id}/metrics", json=wire.Batch(tuple(points)).to_json(),
                      headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert answer.status_code == 200, answer.text


def _leave_files(run: Seeded, shared: Path) -> Seeded:
    """Each rank's stdout and stderr (empty while starting), torchrun's own log (with a restart's cause), and once
    it trained a checkpoint with its sidecar."""
    run_dir = shared / "logs" / f"run-{run.id}"
    attempts = 2 if run.state == "restarted" else 1
    for attempt in range(attempts):
        for rank in (0, 1):
            ranks = run_dir / "ranks" / "walk_x1" / f"attempt_{attempt}" / str(rank)
            ranks.mkdir(parents=True, exist_ok=True)
            steps = range(1, STEPS + 1) if run.state != "starting" else range(0)
            (ranks / "stdout.log").write_text("".join(f"[rank {rank}] step {s} loss {2 / s:.4f}\n" for s in steps))
            (ranks / "stderr.log").write_text(_stderr(run.state, rank))
    launcher = f"{LAUNCH_MARKER}walk ---\nW1121 torch/distributed/run.py] Setting OMP_NUM_THREADS\n"
    if run.state == "restarted":
        launcher += "torch.distributed.elastic.multiprocessing.api: failed (exitcode: -9) local_rank: 1 (pid: 4242)\n"
    (run_dir / LAUNCHER_LOG).write_text(launcher)
    if run.state in UNSTARTED:
        return replace(run, has_logs=True)
    folder = shared / "checkpoints" / f"run-{run.id}"
    folder.mkdir(parents=True, exist_ok=True)
    name = wire.checkpoint_name(STEPS)
    torch.save({"model": torch.nn.Linear(4, 3).state_dict(), "step": STEPS, "epoch": 2}, folder / name)
    sidecar = wire.CheckpointSidecar(name, STEPS, 2, {"loss": 0.05, "epoch_loss": 0.07},
                                     (folder / name).stat().st_size, time.time(), "epoch")  # fmt: skip
    (folder / wire.sidecar_name(name)).write_text(json.dumps(sidecar.to_json()))
    return replace(run, checkpoint=name, checkpoint_path=f"checkpoints/run-{run.id}/{name}", has_logs=True)


def _stderr(state: str, rank: int) -> str:
    if state == "starting":
        return ""
    if state == "failed" and rank == 1:
        return ('Traceback (most recent call last):\n  File "trainer/train.py", line 212, in step\n'
                "ValueError: loss is NaN at step 40\n")  # fmt: skip
    return f"rank {rank} warning: the data loader is slow\n"


def _settle(sessions: Sessions, seeded: dict[str, Seeded]) -> None:
    """Moves each run to its state, with the columns and events the supervisor would have written."""
    now = utcnow()
    with sessions() as db, db.begin():
        for state, one in seeded.items():
            run = db.get(Run, one.id)
            assert run is not None
            if state not in WAITING:
                run.started_at = now - (timedelta(seconds=30) if state == "starting" else timedelta(hours=1))
                run.created_at = run.started_at - timedelta(seconds=5)
            _SETTLE.get(state, lambda db, run, now: None)(db, run, now)


def _stopping(db: Session, run: Run, now: Any) -> None:
    run.stop_requested_at = now
    transitions.move(db, run, RunStatus.stopping, "stop requested: finishing the step, saving")


def _ended(status: RunStatus, exit_code: int | None, reason: str) -> Callable[[Session, Run, Any], None]:
    def end(db: Session, run: Run, now: Any) -> None:
        if status == RunStatus.stopped:
            _stopping(db, run, now - timedelta(minutes=2))
        run.finished_at, run.exit_code, run.devices, run.final_loss = now - timedelta(minutes=1), exit_code, None, 0.05
        if status == RunStatus.succeeded:
            run.trainer_finished, run.step, run.epoch = True, run.total_steps, run.epochs
        transitions.move(db, run, status, reason)

    return end


def _stale(db: Session, run: Run, now: Any) -> None:
    db.execute(update(RunRank).where(RunRank.run_id == run.id).values(heartbeat_at=now - STALE))


_SETTLE: dict[str, Callable[[Session, Run, Any], None]] = {
    "stopping": _stopping,
    "succeeded": _ended(RunStatus.succeeded, 0, "training finished"),
    "failed": _ended(RunStatus.failed, 1, "torchrun exited with 1 before training finished; see the ranks' output"),
    "stopped": _ended(RunStatus.stopped, 0, "stopped on request"),
    "lost": _ended(RunStatus.lost, None, "the run's processes disappeared without recording an exit code"),
    "not progressing": _stale,
    "resumed": _ended(RunStatus.stopped, 0, "stopped on request"),
}


def supervisor_has_seen(api: httpx.Client, seeded: dict[str, Seeded]) -> bool:
    """True once the supervisor recorded the restart and the stall (the events its tick writes)."""
    watched = [seeded[state] for state in ("not progressing", "restarted") if state in seeded]
    return all(
        any(run.says in event["reason"] for event in api.get(f"/api/runs/{run.id}").json()["events"]) for run in watched
    )


def bulk_runs(sessions: Sessions, count: int) -> None:
    """`count` older runs that ended each way, inserted at once: a store with a long history, for the list's pages."""
    spec = {**RunCreate().columns(), "config": RunCreate().config()}  # its options in its config document
    # Only ended runs: a supervisor would find no process behind a live one and end it as lost, and launch a queued one.
    now, statuses = utcnow(), [status for status in RunStatus if status.is_final]
    rows = []
    for i in range(count):
        status = statuses[i % len(statuses)]
        started = now - timedelta(days=30, minutes=i)
        rows.append({**spec, "name": f"history {i}", "status": status, "status_reason": "from the history",
                     "created_at": started, "started_at": None if status == RunStatus.queued else started,
                     "finished_at": started + timedelta(minutes=5) if status.is_final else None,
                     "final_loss": 0.5 if status.is_final else None})  # fmt: skip
    if rows:  # an insert of no rows would insert one of defaults
        with sessions() as db, db.begin():
            db.execute(insert(Run), rows)
