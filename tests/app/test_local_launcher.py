"""Which GPUs the local launcher hands out: only those the server itself may use (its CUDA_VISIBLE_DEVICES), each
named to a run by the index NVML and the Host page use. With the fake NVML: this machine has no GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.folders import RunFolders
from app.launcher.local import LocalLauncher
from app.models import Run
from app.settings import Settings
from trainer import gpu


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
