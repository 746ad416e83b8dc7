"""Rank logs: the tail of a huge file costs only its end, live reading survives truncation, and the API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rankboard import wire

from app.core.models import Run, RunStatus
from app.services import logs
from tests.app.conftest import move_run
from tests.app.test_stream import events
from tests.live import REPO, free_port

GIB = 1024**3


def bytes_read() -> int:
    """What this process has read through read(2) so far, as the kernel counts it: the honest cost of a call."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"])


@pytest.fixture
def huge_log(tmp_path: Path) -> Path:
    """A 1 GiB log: a sparse gigabyte (no disk used) and then 10,000 lines, every 100th a warning."""
    path = tmp_path / "stdout.log"
    with open(path, "wb") as f:
        f.truncate(GIB)
        f.seek(GIB)
        f.write(b"".join(f"step {i} loss {1 / (i + 1):.4f}\n".encode() for i in range(10_000) if i % 100))
        f.write(b"".join(f"WARNING: step {i} slow\n".encode() for i in range(0, 10_000, 100)))
    return path


def test_the_tail_of_a_gigabyte_reads_only_its_last_blocks(huge_log: Path) -> None:
    before = bytes_read()
    found = logs.tail(huge_log, 200)
    cost = bytes_read() - before
    assert found.lines[-1] == "WARNING: step 9900 slow" and len(found.lines) == 200
    assert found.size > GIB and found.end == found.size and not found.budget_hit
    assert cost <= 2 * logs.BLOCK, cost  # two blocks of a gigabyte


def test_a_filter_is_case_insensitive_and_gives_up_after_its_budget(huge_log: Path) -> None:
    found = logs.tail(huge_log, 50, "warning")
    assert found.lines == [f"WARNING: step {i} slow" for i in range(5000, 10_000, 100)]

    before = bytes_read()
    missing = logs.tail(huge_log, 10, "no such text")
    cost = bytes_read() - before
    assert missing.lines == [] and missing.budget_hit  # the answer says that older lines were not searched
    assert logs.SCAN_BUDGET <= cost <= logs.SCAN_BUDGET + logs.BLOCK, cost


def test_a_line_still_being_written_is_left_to_the_live_reader(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"one\ntwo\nthr")
    assert logs.tail(path, 10).lines == ["one", "two", "thr"]
    live = logs.tail(path, 10, partial=False)
    assert live.lines == ["one", "two"] and live.end == len(b"one\ntwo\n")


def test_a_line_longer_than_a_block_is_shown_cut_and_followed_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"first\n" + b"progress " * 100_000)  # 900 kB without a newline, still being written
    live = logs.tail(path, 10, partial=False)
    assert live.lines == ["first"] and live.end == len(b"first\n")
    shown = logs.tail(path, 10, "PROGRESS").lines
    assert shown == [("progress " * 2000)[: logs.MAX_LINE_CHARS] + "…"]


def test_read_from_follows_growth_in_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"a\nb\n")
    first = logs.read_from(path, 0)
    assert first.lines == ["a", "b"] and first.offset == 4 and not first.restarted
    with open(path, "ab") as f:
        f.write(b"half a li")
    assert logs.read_from(path, first.offset).lines == []  # cut at the last newline: nothing whole yet
    with open(path, "ab") as f:
        f.write(b"ne\nc\n")
    second = logs.read_from(path, first.offset, inode=first.inode)
    assert second.lines == ["half a line", "c"] and second.offset == path.stat().st_size
    assert logs.read_from(path, second.offset).lines == []


def test_read_from_restarts_after_truncation_or_rotation(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"old line one\nold line two\n")
    seen = logs.read_from(path, 0)
    path.write_bytes(b"new\n")  # truncated and rewritten, shorter than what was read
    again = logs.read_from(path, seen.offset, inode=seen.inode)
    assert again.restarted and again.lines == ["new"]

    path.rename(tmp_path / "log.1")  # rotated: a new file under the old name, already longer than the offset
    path.write_bytes(b"rotated 1\nrotated 2\nrotated 3\n")
    rotated = logs.read_from(path, again.offset, inode=again.inode)
    assert rotated.restarted and rotated.lines == ["rotated 1", "rotated 2", "rotated 3"]


def test_read_from_is_capped_and_a_finished_files_last_line_is_read(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"x" * 100 + b"\n" + b"y" * 10)
    capped = logs.read_from(path, 0, limit=50)
    assert capped.lines == ["x" * 50] and capped.offset == 50  # a line longer than a read does not stall
    rest = logs.read_from(path, capped.offset)
    assert rest.lines == ["x" * 50] and rest.offset == 101
    assert logs.read_from(path, rest.offset, final=True).lines == ["y" * 10]


def rank_dir(client: TestClient, run_id: int, rank: int, attempt: int = 0) -> Path:
    """Where torchrun --log-dir <run>/ranks --redirects 3 puts a rank's stdout.log and stderr.log."""
    shared: Path = client.app.state.settings.shared  # type: ignore[attr-defined]
    folder = shared / "logs" / f"run-{run_id}" / "ranks" / "c0ffee_x1" / f"attempt_{attempt}" / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def run_logs(client: TestClient, run_id: int) -> Path:
    """Two ranks' output and the launcher's, as a run leaves them."""
    for rank in (0, 1):
        folder = rank_dir(client, run_id, rank)
        (folder / "stdout.log").write_text("".join(f"[rank {rank}] step {i} loss 0.5\n" for i in range(500)))
        (folder / "stderr.log").write_text(f"rank {rank} warning: slow data loader\n")
    run_folder = folder.parent.parent.parent.parent
    (run_folder / "launcher.log").write_text("W1121 torch/distributed/run.py] Setting OMP_NUM_THREADS\n")
    return run_folder


def test_the_api_lists_each_ranks_files_and_the_launchers(client: TestClient, run_id: int, run_logs: Path) -> None:
    files = client.get(f"/api/runs/{run_id}/logs").json()
    assert [(f["rank"], f["stream"]) for f in files] == [
        (0, "stdout"), (0, "stderr"), (1, "stdout"), (1, "stderr"), (None, "stdout"),
    ]  # fmt: skip
    assert files[1]["size"] == len("rank 0 warning: slow data loader\n") and files[0]["attempt"] == 0
    assert client.get(files[-1]["url"]).json()["lines"] == ["W1121 torch/distributed/run.py] Setting OMP_NUM_THREADS"]


def test_the_api_gives_the_last_lines_filtered(client: TestClient, run_id: int, run_logs: Path) -> None:
    last = client.get(f"/api/runs/{run_id}/logs/1/stdout", params={"lines": 3}).json()
    assert last["lines"] == [f"[rank 1] step {i} loss 0.5" for i in (497, 498, 499)] and not last["budget_hit"]
    found = client.get(f"/api/runs/{run_id}/logs/0/stdout", params={"filter": "STEP 12", "lines": 5}).json()
    assert found["lines"] == [f"[rank 0] step {i} loss 0.5" for i in (125, 126, 127, 128, 129)]


def test_download_streams_the_whole_file_as_an_attachment(client: TestClient, run_id: int, run_logs: Path) -> None:
    response = client.get(f"/api/runs/{run_id}/logs/0/stdout/download")
    assert response.status_code == 200
    assert response.content == (rank_dir(client, run_id, 0) / "stdout.log").read_bytes()
    assert response.headers["content-disposition"] == f'attachment; filename="run-{run_id}-0-stdout.log"'


def test_a_newer_attempt_replaces_the_older_one(client: TestClient, run_id: int, run_logs: Path) -> None:
    (rank_dir(client, run_id, 0, attempt=1) / "stdout.log").write_text("restarted from the snapshot\n")
    assert client.get(f"/api/runs/{run_id}/logs/0/stdout").json()["lines"] == ["restarted from the snapshot"]
    assert {f["attempt"] for f in client.get(f"/api/runs/{run_id}/logs").json()} == {1, None}


@pytest.mark.parametrize(
    ("path", "status", "named"),
    [
        ("logs/7/stdout", 404, "rank 7"),
        ("logs/7/stdout/download", 404, "rank 7"),
        ("logs/0/stdlog", 422, "stream"),
        ("logs/../etc/stdout", 404, ""),
        ("logs/abc/stdout", 422, "rank"),
        ("logs/-1/stdout", 422, "rank"),
        ("logs/launcher/stderr", 404, "launcher/stdout"),
        ("logs/0/stdout?lines=0", 422, "lines"),
        ("logs/0/stdout?lines=100000", 422, "lines"),
    ],
)
def test_bad_requests_are_4xx_naming_what_is_wrong(
    client: TestClient, run_id: int, run_logs: Path, path: str, status: int, named: str
) -> None:
    response = client.get(f"/api/runs/{run_id}/{path}")
    assert response.status_code == status, response.text
    assert named in response.text


def test_unknown_runs_are_404(client: TestClient) -> None:
    for path in ("logs", "logs/0/stdout", "logs/0/stdout/download", "diagnoses"):
        assert client.get(f"/api/runs/99/{path}").status_code == 404
    assert client.get("/runs/99/logs/stream").status_code == 404


def test_a_link_out_of_the_shared_folder_is_never_read(
    client: TestClient, run_id: int, run_logs: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret outside the shared folder\n")
    stdout = rank_dir(client, run_id, 1) / "stdout.log"
    stdout.unlink()
    stdout.symlink_to(secret)
    for path in ("logs/1/stdout", "logs/1/stdout/download", "logs", "diagnoses"):
        response = client.get(f"/api/runs/{run_id}/{path}")
        assert "top secret" not in response.text
    assert client.get(f"/api/runs/{run_id}/logs/1/stdout").status_code == 404


def test_the_live_stream_of_a_finished_run_sends_the_tail_explains_and_ends(
    client: TestClient, run_id: int, run_logs: Path
) -> None:
    (rank_dir(client, run_id, 1) / "stderr.log").write_text(
        'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n'
        "ValueError: bad batch shape (3, 4)"  # no newline at the end: the run is over, so the line is complete
    )
    move_run(client, run_id, RunStatus.failed)
    received = events(client.get(f"/runs/{run_id}/logs/stream", params={"rank": "1", "stream": "stderr"}).text)
    assert [kind for kind, _, _ in received] == ["reset", "lines", "explain", "end"]
    assert json.loads(received[0][1])["lines"][0] == "Traceback (most recent call last):"
    assert json.loads(received[1][1]) == ["ValueError: bad batch shape (3, 4)"]
    assert "What went wrong" in received[2][1] and "bad batch shape (3, 4)" in received[2][1]


def test_the_live_stream_filters_and_validates(client: TestClient, run_id: int, run_logs: Path) -> None:
    move_run(client, run_id, RunStatus.succeeded)
    received = events(client.get(f"/runs/{run_id}/logs/stream", params={"filter": "STEP 499"}).text)
    assert json.loads(received[0][1])["lines"] == ["[rank 0] step 499 loss 0.5"]
    assert client.get(f"/runs/{run_id}/logs/stream", params={"stream": "stdin"}).status_code == 422


def test_a_follower_sees_lines_as_they_are_appended(client: TestClient, run_id: int, run_logs: Path) -> None:
    folders = client.app.state.folders  # type: ignore[attr-defined]
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        follower = logs.LogFollower(0, "stderr")
        first = logs.follow(follower, run, folders=folders)
        assert first.reset and first.lines == ["rank 0 warning: slow data loader"]
        assert logs.follow(follower, run, folders=folders).lines == []
        with open(rank_dir(client, run_id, 0) / "stderr.log", "a") as f:
            f.write("epoch 1 done\n")
        assert logs.follow(follower, run, folders=folders).lines == ["epoch 1 done"]


def test_the_panel_offers_every_rank_and_explains_a_failed_run(client: TestClient, run_id: int, run_logs: Path) -> None:
    panel = client.get(f"/runs/{run_id}/logs").text
    assert ">rank 0</option>" in panel and ">rank 1</option>" in panel
    assert "launcher (torchrun)" in panel and "What went wrong" not in panel
    move_run(client, run_id, RunStatus.failed)
    failed = client.get(f"/runs/{run_id}/logs").text
    assert "What went wrong" in failed and "no failure the dashboard recognises" in failed
    page = client.get(f"/runs/{run_id}").text
    assert f'hx-get="/runs/{run_id}/logs"' in page and "/static/logs.js" in page


def test_only_the_latest_launch_of_a_resumed_run_is_diagnosed(client: TestClient, run_id: int, run_logs: Path) -> None:
    with open(run_logs / "launcher.log", "a") as f:
        f.write("--- rankboard launch 1f2e ---\nOSError: [Errno 28] No space left on device\n")
        f.write("--- rankboard launch 9a8b ---\nW1121 Setting OMP_NUM_THREADS\n")
    assert client.get(f"/api/runs/{run_id}/diagnoses").json() == []


# What a two-agent Slurm run leaves (`--log-dir <run>/ranks/agent$SLURM_PROCID`): each agent its own folder, in it
# torchrun's `<rdzv id>_<random>/attempt_<n>/<local rank>/`, and beside the ranks' logs the marker the client wrote.
SLURM_OUTPUT = (
    "W1122 21:50:01.123000 4242 torch/distributed/run.py:852] Setting OMP_NUM_THREADS environment variable for each "
    "process to be 1 in default, to avoid your system being overloaded.\n"
)


def agent_worker(client: TestClient, run_id: int, agent: int, local_rank: int, attempt: int, rank: int | None) -> Path:
    """A worker's folder of one agent of a Slurm run, with the marker of its global rank unless `rank` is None."""
    shared: Path = client.app.state.settings.shared  # type: ignore[attr-defined]
    run_dir = shared / "logs" / f"run-{run_id}"
    folder = run_dir / "ranks" / f"agent{agent}" / f"41_r{agent}nd" / f"attempt_{attempt}" / str(local_rank)
    folder.mkdir(parents=True)
    (folder / "stdout.log").write_text(f"agent {agent} local rank {local_rank} attempt {attempt}\n")
    (folder / "stderr.log").write_text("")
    if rank is not None:
        (folder / wire.RANK_MARKER).write_text(json.dumps({"rank": rank, "local_rank": local_rank, "node": "node-a"}))
    return folder


def as_slurm_run(client: TestClient, run_id: int, *, nproc_per_node: int) -> Path:
    """The run made a Slurm run (job 41); returns its folder, where Slurm's output file goes."""
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.launcher, run.job_id, run.nproc_per_node = "slurm", "41", nproc_per_node
    shared: Path = client.app.state.settings.shared  # type: ignore[attr-defined]
    run_dir = shared / "logs" / f"run-{run_id}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def test_each_agents_latest_attempt_is_listed_by_the_global_rank_its_workers_marked(
    client: TestClient, run_id: int
) -> None:
    run_dir = as_slurm_run(client, run_id, nproc_per_node=1)
    # c10d numbered the agents in rendezvous order: the first attempt as SLURM_PROCID, the restart the other way.
    for agent, ranks in ((0, (0, 1)), (1, (1, 0))):
        for attempt, rank in enumerate(ranks):
            agent_worker(client, run_id, agent, 0, attempt, rank)
    (run_dir / "slurm-41.out").write_text(SLURM_OUTPUT)
    (run_dir / "launcher.log").write_text("not this run's: a Slurm run's launcher output is Slurm's file\n")

    files = client.get(f"/api/runs/{run_id}/logs").json()
    assert [(f["rank"], f["stream"], f["attempt"], f["rank_guessed"]) for f in files] == [
        (0, "stdout", 1, False), (0, "stderr", 1, False), (1, "stdout", 1, False), (1, "stderr", 1, False),
        (None, "stdout", None, False),
    ]  # fmt: skip
    assert client.get(f"/api/runs/{run_id}/logs/0/stdout").json()["lines"] == ["agent 1 local rank 0 attempt 1"]
    assert client.get(f"/api/runs/{run_id}/logs/1/stdout").json()["lines"] == ["agent 0 local rank 0 attempt 1"]
    launcher = client.get(f"/api/runs/{run_id}/logs/launcher/stdout").json()["lines"]
    assert launcher == [SLURM_OUTPUT.strip()]
    panel = client.get(f"/runs/{run_id}/logs").text
    assert ">rank 0</option>" in panel and ">rank 1</option>" in panel and "(guessed)" not in panel
    assert "Slurm output (slurm-41.out)" in panel and "launcher (torchrun)" not in panel


def test_without_markers_ranks_are_numbered_by_agent_and_said_to_be_guessed(client: TestClient, run_id: int) -> None:
    as_slurm_run(client, run_id, nproc_per_node=2)
    for agent in (0, 1):
        for local_rank in (0, 1):
            agent_worker(client, run_id, agent, local_rank, 0, None)  # a script that does not use rankboard.report

    files = client.get(f"/api/runs/{run_id}/logs").json()
    assert [(f["rank"], f["rank_guessed"]) for f in files if f["stream"] == "stdout"] == [
        (0, True), (1, True), (2, True), (3, True),
    ]  # fmt: skip
    assert client.get(f"/api/runs/{run_id}/logs/2/stdout").json()["lines"] == ["agent 1 local rank 0 attempt 0"]
    panel = client.get(f"/runs/{run_id}/logs").text
    assert ">rank 3 (guessed)</option>" in panel and "does not import <code>rankboard.report</code>" in panel


def test_a_local_runs_one_agent_is_never_called_a_guess(client: TestClient, run_id: int, run_logs: Path) -> None:
    files = client.get(f"/api/runs/{run_id}/logs").json()
    assert {f["rank"] for f in files} == {0, 1, None} and not any(f["rank_guessed"] for f in files)


CANCELLED = "slurmstepd: error: *** JOB 41 ON node-a CANCELLED AT 2026-11-22T21:52:13"


def test_slurms_lines_explain_a_run_and_a_requeue_begins_anew(client: TestClient, run_id: int) -> None:
    run_dir = as_slurm_run(client, run_id, nproc_per_node=1)
    agent_worker(client, run_id, 0, 0, 0, 0)
    output = run_dir / "slurm-41.out"
    output.write_text(f"{SLURM_OUTPUT}{CANCELLED} DUE TO PREEMPTION ***\n")
    found = client.get(f"/api/runs/{run_id}/diagnoses").json()
    assert [(d["kind"], d["rank"]) for d in found] == [("slurm_preempted", None)]
    move_run(client, run_id, RunStatus.failed)
    assert "Preempted (Slurm)" in client.get(f"/runs/{run_id}/logs").text

    with open(output, "a") as f:  # Slurm requeued the job: the next attempt appends to the same file
        f.write(f"{CANCELLED} DUE TO JOB REQUEUE ***\n")
        f.write(SLURM_OUTPUT)
    assert client.get(f"/api/runs/{run_id}/diagnoses").json() == []


HELLO_SCRIPT = """\
import os
from rankboard import report  # leaves this worker's rank marker beside its logs
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"hello from global rank {dist.get_rank()} of agent {os.environ['AGENT']}", flush=True)
dist.destroy_process_group()
"""


def test_a_real_two_agent_rendezvous_is_listed_by_the_ranks_c10d_gave(
    client: TestClient, run_id: int, tmp_path: Path
) -> None:
    """Two torchrun agents rendezvous over c10d, as srun starts them on two nodes: each rank's log is found under
    the global rank that the worker itself printed, whichever agent c10d numbered first."""
    run_dir = as_slurm_run(client, run_id, nproc_per_node=1)
    script = tmp_path / "hello.py"
    script.write_text(HELLO_SCRIPT)
    endpoint = f"127.0.0.1:{free_port()}"
    agents = []
    for agent in (0, 1):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=41",
                   f"--rdzv-conf=is_host={int(agent == 0)}", f"--log-dir={run_dir / 'ranks' / f'agent{agent}'}",
                   "--redirects", "3", "--max-restarts", "0", str(script)]  # fmt: skip
        env = {**os.environ, "AGENT": str(agent), wire.ENV_RUN_ID: str(run_id), "PYTHONPATH": str(REPO)}
        agents.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for agent in agents:
        output, _ = agent.communicate(timeout=120)
        assert agent.returncode == 0, output.decode(errors="replace")

    files = client.get(f"/api/runs/{run_id}/logs").json()
    assert [(f["rank"], f["rank_guessed"]) for f in files if f["stream"] == "stdout"] == [(0, False), (1, False)]
    for rank in (0, 1):
        lines = client.get(f"/api/runs/{run_id}/logs/{rank}/stdout").json()["lines"]
        assert len(lines) == 1 and lines[0].startswith(f"hello from global rank {rank} of agent "), lines
