"""Failures explained, each recognised from a real line: produced here by a real process where this machine can
produce it, copied verbatim from PyTorch's source or its users' reports where it cannot (no GPU here)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.core.models import RunStatus
from app.schemas.logs import DiagnosisOut
from app.services.diagnose import LogText, diagnose, root_cause_ranks
from tests.app.conftest import move_run
from tests.live import REPO

TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def stderr_of(*args: str) -> str:
    """What a Python process prints on stderr, started as a user would start it: with python, not torchrun."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode != 0, done
    return done.stderr


def only(found: list[DiagnosisOut], kind: str) -> DiagnosisOut:
    assert [d.kind for d in found] == [kind], found
    return found[0]


def test_the_trainer_started_with_python_not_torchrun() -> None:
    text = stderr_of("-m", "trainer", "--epochs", "1")
    found = only(diagnose([LogText(0, "stderr", text)]), "not_torchrun")
    assert found.line.startswith("error: LOCAL_RANK is not set") and "torchrun" in found.advice


def test_a_script_reading_local_rank_started_with_python(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import os\nlocal_rank = int(os.environ['LOCAL_RANK'])\n")
    text = stderr_of(str(script))
    found = only(diagnose([LogText(0, "stderr", text)]), "not_torchrun")
    assert found.line == "KeyError: 'LOCAL_RANK'" and found.traceback is not None and "local_rank =" in found.traceback


def test_init_process_group_without_torchruns_environment() -> None:
    text = stderr_of("-c", "import torch.distributed as dist\ndist.init_process_group('gloo')")
    found = only(diagnose([LogText(0, "stderr", text)]), "not_torchrun")
    assert "environment variable RANK expected, but not set" in found.line


@pytest.mark.parametrize(
    "code",
    [
        # torch's own store, as torchrun's rendezvous or init_process_group binds it
        "import datetime, socket\nfrom torch.distributed import TCPStore\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "TCPStore('127.0.0.1', s.getsockname()[1], 1, True, timeout=datetime.timedelta(seconds=5))",
        # any server of the user's own
        "import socket\na = socket.socket(); a.bind(('127.0.0.1', 0))\nsocket.socket().bind(a.getsockname())",
    ],
    ids=["torch-tcpstore", "socket"],
)
def test_address_already_in_use(code: str) -> None:
    text = stderr_of("-c", code)
    found = only(diagnose([LogText(None, "stdout", text)]), "address_in_use")
    assert found.rank is None and found.traceback is not None
    assert ("EADDRINUSE" in found.line) or found.line == "OSError: [Errno 98] Address already in use"


def test_no_space_left_on_device() -> None:
    # A full disk is not available here; this is the OSError a failed write raises, printed by Python itself.
    text = stderr_of("-c", "import errno, os\nraise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))")
    found = only(diagnose([LogText(1, "stderr", text)]), "no_space")
    assert found.line == "OSError: [Errno 28] No space left on device" and found.rank == 1
    assert "checkpoints" in found.advice


# Copied verbatim (no GPU here): a CUDA OOM line from murong-xu/CADS issue #4, as PyTorch 2.x words it
# (c10/cuda/CUDACachingAllocator.cpp), and the older wording from the title of pytorch/pytorch issue #16417.
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total capacity of 31.47 GiB"
    " of which 12.73 GiB is free. Including non-PyTorch memory, this process has 18.73 GiB memory in use. Of the "
    "allocated memory 9.08 GiB is allocated by PyTorch, and 9.35 GiB is reserved by PyTorch but unallocated. If "
    "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
CUDA_OOM_OLD = (
    "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; "
    "8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)"
)
# Copied verbatim: the NCCL watchdog's lines from XPixelGroup/BasicSR issue #737 (torch's
# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp writes "Watchdog caught collective operation timeout: ").
NCCL_WATCHDOG = (
    "[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for "
    "600020 milliseconds before timing out."
)
# and from sgl-project/sglang issue #1693, the line that follows it when the watchdog takes the process down
NCCL_FAILED = (
    "[rank4]:[E1016 03:31:38.929241154 ProcessGroupNCCL.cpp:621] [Rank 4] Some NCCL operations have failed or timed "
    "out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
    "data."
)


@pytest.mark.parametrize("line", [CUDA_OOM, CUDA_OOM_OLD])
def test_cuda_out_of_memory(line: str) -> None:
    found = only(diagnose([LogText(0, "stdout", "step 10 loss 0.3\n"), LogText(0, "stderr", line + "\n")]), "cuda_oom")
    assert found.line == line and "batch" in found.advice and "mixed precision" in found.advice


@pytest.mark.parametrize("line", [NCCL_WATCHDOG, NCCL_FAILED])
def test_nccl_timeout(line: str) -> None:
    found = only(diagnose([LogText(1, "stderr", line + "\n")]), "nccl_timeout")
    assert "NCCL_DEBUG=INFO" in found.advice and "nvidia-smi" in found.advice


def test_a_line_seen_on_every_rank_is_one_diagnosis_naming_them_all() -> None:
    watchdog = [NCCL_WATCHDOG.replace("[rank1]:", f"[rank{r}]:") + "\n" for r in range(3)]  # each rank's own prefix
    found = only(diagnose([LogText(r, "stderr", watchdog[r], modified=10.0 - r) for r in range(3)]), "nccl_timeout")
    assert found.rank == 2 and found.ranks == [2, 1, 0]  # rank 2's log stopped changing first


@pytest.mark.parametrize("lost_changed", [200.0, 50.0], ids=["after", "before"])
def test_the_exception_of_the_rank_that_failed_first_is_shown(lost_changed: float) -> None:
    """Rank 0 only lost its peer: listed after rank 3's error, even where its log stopped changing first."""
    lost = stderr_of("-c", "raise RuntimeError('Connection closed by peer')")
    early = stderr_of("-c", "def load(i):\n    raise IndexError(f'sample {i} out of range')\nload(7)")
    logs = [LogText(0, "stderr", lost, modified=lost_changed), LogText(3, "stderr", early, modified=100.0)]
    found, lost_peer = diagnose(logs)
    assert (found.kind, lost_peer.kind, lost_peer.rank) == ("exception", "peer_lost", 0)
    assert found.rank == 3 and found.line == "IndexError: sample 7 out of range"
    assert found.traceback is not None and found.traceback.startswith("Traceback (most recent call last):")
    assert "in load" in found.traceback and "Connection closed" not in found.traceback


def test_of_several_tracebacks_in_one_log_the_last_is_the_one_that_ended_it() -> None:
    survived = stderr_of("-c", "raise TimeoutError('data server slow, retrying')")
    fatal = stderr_of("-c", "raise MemoryError('host memory exhausted')")
    found = only(diagnose([LogText(0, "stderr", survived + "retry 1 worked\n" + fatal)]), "exception")
    assert found.line == "MemoryError: host memory exhausted" and "TimeoutError" not in (found.traceback or "")


def test_a_chain_of_exceptions_is_one_traceback() -> None:
    text = stderr_of("-c", "try:\n    {}['x']\nexcept KeyError:\n    raise ValueError('config has no x')")
    found = only(diagnose([LogText(0, "stderr", text)]), "exception")
    assert found.line == "ValueError: config has no x"
    assert found.traceback is not None and "KeyError: 'x'" in found.traceback and "During handling" in found.traceback


CHAINED_SCRIPT = """\
def parse(config):
    return {10: "ten",
            11: config["x"]}


try:
    parse({})
except KeyError:
    raise ValueError("config has no x")
"""
INIT_PROCESS_GROUP = """\
import torch.distributed as dist

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
"""


@pytest.mark.parametrize("prefix", ["[rank0]: ", ""], ids=["torch-prefix", "none"])
def test_a_chain_of_exceptions_is_one_traceback_with_or_without_torchs_prefix(tmp_path: Path, prefix: str) -> None:
    """Once init_process_group ran, torch writes "[rank<n>]: " before each line but the chain's blank ones. A source
    line that starts with a number and a colon is no srun label, in a rank's log or in the launcher's."""
    script = tmp_path / "chained.py"
    script.write_text((INIT_PROCESS_GROUP if prefix else "") + CHAINED_SCRIPT)
    text = stderr_of(str(script))
    assert f'{prefix}    11: config["x"]}}' in text.splitlines() and "" in text.splitlines()
    for log in (LogText(0, "stderr", text), LogText(None, "stdout", text)):
        found = only(diagnose([log]), "exception")
        assert found.line == "ValueError: config has no x" and found.traceback is not None
        assert "KeyError: 'x'" in found.traceback and "\n\nDuring handling" in found.traceback
        assert "[rank0]" not in found.traceback and '\n    11: config["x"]}\n' in found.traceback


FAILING_SCRIPT = """
import os, time
rank = int(os.environ["RANK"])
print(f"rank {rank} starting", flush=True)
if rank == 1:
    time.sleep(0.5)
    raise ValueError("bad batch shape (3, 4)")
time.sleep(30)  # rank 0 waits; torchrun stops it when rank 1 fails
"""


def test_a_real_torchrun_failure_is_explained_from_its_root_cause_rank(
    client: TestClient, run_id: int, tmp_path: Path
) -> None:
    """torchrun's own output names the first failure; rank 1's traceback is shown, not torchrun's."""
    run_dir: Path = client.app.state.settings.shared / "logs" / f"run-{run_id}"  # type: ignore[attr-defined]
    run_dir.mkdir(parents=True)
    script = tmp_path / "fail.py"
    script.write_text(textwrap.dedent(FAILING_SCRIPT))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "--log-dir", str(run_dir / "ranks"), "--redirects", "3", "--max-restarts", "0", str(script)]  # fmt: skip
    with open(run_dir / "launcher.log", "wb") as log:
        assert subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=120).returncode == 1
    assert "Root Cause (first observed failure)" in (run_dir / "launcher.log").read_text()

    found = client.get(f"/api/runs/{run_id}/diagnoses").json()
    assert [(d["kind"], d["rank"], d["line"]) for d in found] == [
        ("exception", 1, "ValueError: bad batch shape (3, 4)")
    ]
    assert 'raise ValueError("bad batch shape (3, 4)")' in found[0]["traceback"]
    assert "ChildFailedError" not in found[0]["traceback"]
    tail = client.get(f"/api/runs/{run_id}/logs/0/stdout").json()["lines"]
    assert tail == ["rank 0 starting"]


KEY_ERROR_SCRIPT = """\
import signal
import time

import torch.distributed as dist

dist.init_process_group("gloo")  # from here on torch writes "[rank<n>]: " before each line of an uncaught exception
rank = dist.get_rank()
print(f"rank {rank} starting", flush=True)
dist.barrier()
if rank == 1:
    time.sleep(0.5)
    config = {}
    config["lr"]
# Rank 0 outlives torchrun's SIGTERM, however slow the machine, so that it always writes what a rank says when its
# peer dies under it: gloo's "Connection closed by peer".
signal.signal(signal.SIGTERM, signal.SIG_IGN)
dist.barrier()
"""
# How torchrun writes the ranks' output: into its own (plain); into files of each rank's own under --log-dir
# (--redirects); or both, its own copy prefixed with "[default<local rank>]:" (--tee).
LOG_MODES = {"plain": [], "tee": ["--tee", "3"], "redirects": ["--redirects", "3"]}
# What rank 1's exception line is written as in each, torch's own prefix innermost.
KEY_ERROR_AS_WRITTEN = {
    "plain": "[rank1]: KeyError: 'lr'",
    "tee": "[default1]:[rank1]: KeyError: 'lr'",
    "redirects": "[rank1]: KeyError: 'lr'",
    "srun-label": "0: [default1]:[rank1]: KeyError: 'lr'",
}


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real torchrun run of KEY_ERROR_SCRIPT for each of LOG_MODES, run side by side: each one's folder, with
    torchrun's own output in launcher.log and the ranks' files (when it writes them) under ranks/."""
    root = tmp_path_factory.mktemp("captured")
    script = root / "key_error.py"
    script.write_text(KEY_ERROR_SCRIPT)
    agents = {mode: _torchrun(root / mode, script, options) for mode, options in LOG_MODES.items()}
    for mode, agent in agents.items():
        assert agent.wait(timeout=120) == 1, (root / mode / "launcher.log").read_text()
    return {mode: root / mode for mode in agents}


def _torchrun(folder: Path, script: Path, options: list[str]) -> subprocess.Popen[bytes]:
    folder.mkdir()
    log_dir = ["--log-dir", str(folder / "ranks")] if options else []
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "--max-restarts", "0", *log_dir, *options, str(script)]  # fmt: skip
    with open(folder / "launcher.log", "wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=folder)


def logs_of(folder: Path) -> list[LogText]:
    """A captured run's logs as the service reads them: each rank's files, then torchrun's own output."""
    ranks = [LogText(int(p.parent.name), p.stem, p.read_text(), p.stat().st_mtime)
             for p in sorted(folder.glob("ranks/*/attempt_0/*/*.log"))]  # fmt: skip
    launcher = folder / "launcher.log"
    return [*ranks, LogText(None, "stdout", launcher.read_text(), launcher.stat().st_mtime)]


def srun_label(text: str, task: int = 0, width: int = 1) -> str:
    """`text` as `srun --label` writes a task's output into Slurm's output file: "%*d: " before every line."""
    return "".join(f"{task:>{width}}: {line}" for line in text.splitlines(keepends=True))


@pytest.mark.parametrize("mode", [*LOG_MODES, "srun-label"])
def test_a_keyerror_on_rank_1_is_explained_first_whatever_prefixes_its_lines(
    captured: dict[str, Path], mode: str
) -> None:
    """Each prefix is stripped exactly, its space included: the exception line is no frame, and rank 0's lost peer
    follows rank 1's error. srun --label's form is the --tee run's own output labelled as srun does for one task."""
    logs = logs_of(captured["tee" if mode == "srun-label" else mode])
    if mode == "srun-label":
        logs = [LogText(None, "stdout", srun_label(logs[-1].text))]  # Slurm's output file holds it alone
    assert any(KEY_ERROR_AS_WRITTEN[mode] in log.text.splitlines() for log in logs)

    found = diagnose(logs)
    assert [(d.kind, d.rank) for d in found] == [("exception", 1), ("peer_lost", 0)]
    error, lost = found
    assert error.line == "KeyError: 'lr'" and error.ranks == [1] and error.traceback is not None
    assert error.traceback.startswith("Traceback (most recent call last):\n  File ")
    assert error.traceback.endswith("\n    config[\"lr\"]\n    ~~~~~~^^^^^^\nKeyError: 'lr'")
    assert "Connection closed by peer" in lost.line and "dist.barrier()" in (lost.traceback or "")
    in_own_files = mode in ("tee", "redirects")  # the --tee copy in torchrun's output is not read twice
    assert (error.log_rank, error.stream) == ((1, "stderr") if in_own_files else (None, "stdout"))


def test_a_failed_runs_panel_opens_on_the_log_of_the_rank_that_failed(
    client: TestClient, run_id: int, captured: dict[str, Path]
) -> None:
    run_dir: Path = client.app.state.settings.shared / "logs" / f"run-{run_id}"  # type: ignore[attr-defined]
    shutil.copytree(captured["redirects"], run_dir)  # as copy2 copies: each file keeps when it last changed
    move_run(client, run_id, RunStatus.failed)

    found = client.get(f"/api/runs/{run_id}/diagnoses").json()
    assert [(d["kind"], d["rank"], d["log_rank"], d["stream"]) for d in found] == [
        ("exception", 1, 1, "stderr"), ("peer_lost", 0, 0, "stderr"),
    ]  # fmt: skip
    panel = client.get(f"/runs/{run_id}/logs").text
    assert '<option value="1" selected>' in panel and '<option value="stderr" selected>' in panel
    assert panel.index("Python exception: KeyError") < panel.index("Lost a peer")
    assert "Show rank 1's stderr" in panel


CAPTURED = Path(__file__).parent / "captured"


def captured_file(name: str) -> str:
    """A log committed as it was captured from a real run, without the header that says how."""
    return (CAPTURED / name).read_text().split("# ---\n", 1)[1]


@pytest.mark.parametrize(
    "label",
    [
        lambda task: f"{task}: ",  # as captured: two tasks
        lambda task: f"{task:>2}: ",  # srun pads to the widest task's number: ten tasks or more
        lambda task: f"P0 {task}: ",  # a heterogeneous job's first component
    ],
    ids=["as-captured", "padded", "heterogeneous"],
)
def test_slurms_output_of_two_labelled_agents_leads_with_the_rank_that_failed(label: Callable[[int], str]) -> None:
    """Both agents' torchrun name a root cause, each its own rank, at the same second: rank 0 only lost its peer."""
    text = re.sub(r"^(\d+): ", lambda m: label(int(m[1])), captured_file("srun_label_two_agents.out"), flags=re.M)
    assert root_cause_ranks([LogText(None, "stdout", text)]) == {0, 1}
    found = diagnose([LogText(None, "stdout", text)])
    assert [(d.kind, d.rank, d.log_rank) for d in found] == [("exception", 1, None), ("peer_lost", 0, None)]
    assert found[0].line == "KeyError: 'lr'" and found[0].traceback is not None
    assert found[0].traceback.splitlines() == [
        "Traceback (most recent call last):", '  File "/tmp/cap/slurm/fail2.py", line 11, in <module>',
        '    config["lr"]', "    ~~~~~~^^^^^^", "KeyError: 'lr'",
    ]  # fmt: skip


# torchrun's report when a rank died without a word (copied from a capture above, the rank killed by SIGKILL).
KILLED_REPORT = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
fail.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_02:32:02
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4453)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4453
============================================================
"""


def test_a_failed_runs_panel_without_a_recognised_failure_opens_on_the_root_cause_ranks_stderr(
    client: TestClient, run_id: int
) -> None:
    run_dir: Path = client.app.state.settings.shared / "logs" / f"run-{run_id}"  # type: ignore[attr-defined]
    for rank in (0, 1):
        (run_dir / "ranks" / "x_1" / "attempt_0" / str(rank)).mkdir(parents=True)
        (run_dir / "ranks" / "x_1" / "attempt_0" / str(rank) / "stdout.log").write_text(f"rank {rank} step 1\n")
    (run_dir / "launcher.log").write_text(KILLED_REPORT)
    move_run(client, run_id, RunStatus.failed)
    assert client.get(f"/api/runs/{run_id}/diagnoses").json() == []
    panel = client.get(f"/runs/{run_id}/logs").text
    assert '<option value="1" selected>' in panel and '<option value="stderr" selected>' in panel


def test_a_stopped_torchrun_is_no_failure(tmp_path: Path) -> None:
    """SIGTERM to torchrun (how a run is stopped) makes it print a traceback of its own; that explains nothing."""
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('working', flush=True)\ntime.sleep(60)\n")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
               "--log-dir", str(tmp_path / "ranks"), "--redirects", "3", str(script)]  # fmt: skip
    agent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("ranks/*/attempt_0/0/stdout.log")) or "working" not in _stdout(tmp_path):
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.2)
    agent.send_signal(signal.SIGTERM)
    output, _ = agent.communicate(timeout=60)
    assert "SignalException" in output
    assert diagnose([LogText(None, "stdout", output), LogText(0, "stdout", _stdout(tmp_path))]) == []


def _stdout(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in tmp_path.glob("ranks/*/attempt_0/0/stdout.log"))


# Slurm's own lines, as slurmstepd and srun of Slurm 22.05 write them into the job's output file (their formats are
# the strings in this machine's /usr/sbin/slurmstepd and Slurm's plugins: "*** %s ON %s CANCELLED AT %s ***", ...).
CANCELLED = "slurmstepd: error: *** JOB 41 ON node-a CANCELLED AT 2026-11-22T21:52:13"
OOM_KILL = "Some of your processes may have been killed by the cgroup out-of-memory handler."
SLURM_LINES = [
    ("slurm_cancelled", f"{CANCELLED} ***"),
    ("slurm_time_limit", f"{CANCELLED} DUE TO TIME LIMIT ***"),
    ("slurm_time_limit", CANCELLED.replace("JOB 41", "STEP 41.0") + " DUE TO TIME LIMIT ***"),
    ("slurm_preempted", f"{CANCELLED} DUE TO PREEMPTION ***"),
    ("slurm_node_failure", f"{CANCELLED} DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"),
    ("slurm_oom", f"slurmstepd: error: Detected 1 oom-kill event(s) in StepId=41.0. {OOM_KILL}"),
    ("slurm_oom", f"slurmstepd: error: Detected 3 oom-kill event(s) in StepId=41.batch. {OOM_KILL}"),
    ("slurm_oom", "srun: error: node-a: task 1: Out Of Memory"),
]
# What torchrun's agents write as Slurm's signal kills them: a report, not a cause.
AGENT_DEATH = """\
W1122 21:52:13.512000 4242 torch/distributed/elastic/agent/server/api.py:725] Received Signals.SIGTERM death signal, \
shutting down workers
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/distributed/run.py", line 936, in main
    run(args)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15
"""


@pytest.mark.parametrize(("kind", "line"), SLURM_LINES)
def test_slurms_lines_in_its_output_file_are_explained(kind: str, line: str) -> None:
    text = "W1122 21:50:01.123000 4242 torch/distributed/run.py:852] Setting OMP_NUM_THREADS\n" + line + "\n"
    found = only(diagnose([LogText(None, "stdout", text + AGENT_DEATH), LogText(0, "stdout", "step 12 loss 0.5\n")]),
                 kind)  # fmt: skip
    assert found.line == line and found.rank is None and found.ranks == []
    assert found.title and found.cause and found.advice and "Slurm" in found.title


def test_a_step_cancelled_because_another_task_failed_is_left_to_that_tasks_error() -> None:
    """srun --kill-on-bad-exit cancels the step when one task fails: the cause is in the ranks' logs."""
    launcher = ("srun: error: node-a: task 1: Exited with exit code 1\nsrun: Terminating StepId=41.0\n"
                "slurmstepd: error: *** STEP 41.0 ON node-a CANCELLED AT 2026-11-22T21:52:13 ***\n")  # fmt: skip
    failed = 'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\nValueError: bad batch\n'
    found = diagnose([LogText(None, "stdout", launcher), LogText(1, "stderr", failed)])
    assert [(d.kind, d.rank) for d in found] == [("exception", 1)]


def test_two_stopped_agents_tracebacks_interleaved_in_one_file_are_no_failure() -> None:
    """Every node's torchrun writes to Slurm's one output file: after a stop their SignalException reports mix."""
    frames = [
        '  File "torch/distributed/run.py", line 1032, in <module>\n    main()\n',
        '  File "torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler\n',
    ]
    start = "Traceback (most recent call last):\n"
    report = "torch.distributed.elastic.multiprocessing.api.SignalException: Process {} got signal: 15\n"
    mixed = start + frames[0] + start + frames[0] + frames[1] + report.format(41) + frames[1] + report.format(42)
    assert diagnose([LogText(None, "stdout", "srun: error: vm: tasks 0-1: Exited with exit code 1\n" + mixed)]) == []


def test_a_desync_check_names_the_ranks_that_missed_the_barrier() -> None:
    line = "[rank0]: RuntimeError: [Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 15000 ms"
    (found,) = [d for d in diagnose([LogText(0, "stderr", line + "\n")]) if d.kind == "desync"]
    assert found.line.endswith("Ranks 1, 3 failed to pass monitoredBarrier in 15000 ms") and found.title.startswith(
        "A rank never reached"
    )
