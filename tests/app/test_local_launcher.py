"""Which GPUs the local launcher hands out: only those the server itself may use (its CUDA_VISIBLE_DEVICES), each
named to a run by the index NVML and the Host page use (with the fake NVML: this machine has no GPU); and how long
torchrun lets a rank finish once asked to stop."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from rankboard import gpu

from app.core.folders import RunFolders
from app.core.models import Run
from app.core.settings import Settings
from app.launcher import processes
from app.launcher.local import EXIT_FILE, LocalLauncher
from tests.live import run_processes, wait_for


def launcher_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, visible: str | None, slots: int | None = None
) -> LocalLauncher:
    fake = tmp_path / "nvml.json"
    gpus = [{"uuid": f"GPU-{i}aaa-fake", "name": "NVIDIA H100 80GB HBM3"} for i in range(4)]
    fake.write_text(json.dumps({"gpus": gpus}))
    monkeypatch.setenv(gpu.ENV_FAKE_NVML, str(fake))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared", slots=slots)
    return LocalLauncher(settings, RunFolders(tmp_path / "shared"))


def test_every_gpu_is_a_slot_when_the_server_may_use_them_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = launcher_on(tmp_path, monkeypatch, visible=None)
    assert (launcher.gpu_count, launcher.capacity, launcher.slots) == (4, 4, [0, 1, 2, 3])


def test_a_server_given_two_gpus_hands_out_those_two_by_their_own_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher = launcher_on(tmp_path, monkeypatch, visible="GPU-3aaa,1")
    assert (launcher.gpu_count, launcher.capacity, launcher.slots) == (2, 2, [3, 1])
    env = launcher._environment(Run(id=7, name="r"), "token", "launch", devices=[1])
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"]) == ("1", "PCI_BUS_ID")


def test_slots_never_exceed_the_gpus_a_run_could_get(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert launcher_on(tmp_path, monkeypatch, visible="0,1", slots=8).slots == [0, 1]
    assert launcher_on(tmp_path, monkeypatch, visible=None, slots=2).slots == [0, 1]


def test_a_server_hidden_from_every_gpu_runs_on_cpu_slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """How the test suite runs on a GPU node (tests/conftest.py): no run is given a GPU, nor sees one."""
    launcher = launcher_on(tmp_path, monkeypatch, visible="", slots=2)
    assert (launcher.gpu_count, launcher.slots) == (0, [0, 1])
    env = launcher._environment(Run(id=7, name="r"), "token", "launch", devices=[0, 1])
    assert env["CUDA_VISIBLE_DEVICES"] == ""


# Each rank, asked to stop, takes 20 s to "save", as a big checkpoint would.
SLOW_TO_SAVE = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    marks = Path(sys.argv[1])
    rank = os.environ["RANK"]
    def save_then_exit(*_):
        (marks / f"asked-{rank}").touch()
        time.sleep(20)
        (marks / f"saved-{rank}").touch()
        sys.exit(0)
    signal.signal(signal.SIGTERM, save_then_exit)
    (marks / f"ready-{rank}").touch()
    while True:
        time.sleep(1)
""")


def test_torchrun_kills_the_ranks_at_the_stop_grace_not_at_its_own_30_s(tmp_path: Path) -> None:
    """A stop reaches torchrun, which SIGTERMs the ranks and SIGKILLs them after 30 s unless told otherwise: with
    the default 60 s grace, a rank 40 s into its checkpoint was killed. Told a 1 s grace, it kills a rank 20 s in."""
    script, marks = tmp_path / "slow_to_save.py", tmp_path / "marks"
    script.write_text(SLOW_TO_SAVE)
    marks.mkdir()
    settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared", slots=2, stop_grace_s=1)
    launcher = LocalLauncher(settings, RunFolders(tmp_path / "shared"))
    run = Run(id=1, name="slow to save", nproc_per_node=2, max_restarts=0, script=str(script), script_args=[str(marks)])
    launch = launcher.start(run, token="token", devices=[0, 1])
    run.pid, run.pid_start_ticks = launch.pid, launch.start_ticks
    exit_file = launcher.folders.run_dir(run) / EXIT_FILE
    try:
        wait_for(lambda: len(list(marks.glob("ready-*"))) == 2, 60, what="both ranks started")
        launcher.terminate(run)  # what Stop does first; the server's own SIGKILL, after the grace, is not sent here
        ended = wait_for(lambda: exit_file.exists() and json.loads(exit_file.read_text()), 60, what="torchrun's exit")
    finally:
        processes.kill_all(run_processes(tmp_path))  # the test must not leave a rank behind, whatever happened
    assert ended["exit_code"] != 0
    assert sorted(path.name for path in marks.glob("[as]*")) == ["asked-0", "asked-1"]  # neither got to "saved"
