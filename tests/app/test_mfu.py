"""Model FLOPs and MFU, checked by hand: the MLP's FLOPs from its layer shapes, MFU from them and a known peak."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rankboard import wire
from torch.utils.flop_counter import FlopCounterMode

from app.core.folders import RunFolders
from app.core.models import Run
from app.core.settings import Settings
from app.launcher.slurm import SlurmLauncher
from app.services import mfu
from trainer.workloads import WORKLOADS


def test_the_mlps_model_flops_are_six_times_its_multiply_accumulates() -> None:
    # Linear 32->256, 256->256, 256->10: 76,288 multiply-accumulates a sample; 2 FLOPs each forward, 4 backward.
    assert WORKLOADS["mlp"].flops_per_sample == 6 * (32 * 256 + 256 * 256 + 256 * 10) == 457_728


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_a_workloads_forward_flops_are_what_torch_counts(name: str) -> None:
    workload = WORKLOADS[name]
    inputs, _targets = workload.build_data()[0][0:1]
    with FlopCounterMode(display=False) as counter:
        workload.build_model()(inputs)
    assert counter.get_total_flops() * 3 == workload.flops_per_sample


def test_mfu_is_the_flops_achieved_over_the_peak_of_every_process() -> None:
    # 457,728 FLOPs x 1,000,000 samples/s = 0.457728 TFLOP/s, on 2 H100 SXM at 989.4 TFLOP/s bf16 each.
    result = mfu.compute(flops_per_sample=457_728, samples_per_s=1e6, gpu="NVIDIA H100 80GB HBM3", precision="bf16",
                         processes=2)  # fmt: skip
    assert result.achieved_tflops == pytest.approx(0.457728)
    assert result.peak_tflops == 989.4
    assert result.mfu == pytest.approx(0.457728 / 1978.8)


def test_the_peak_depends_on_the_model_and_the_precision_and_may_be_unknown() -> None:
    assert mfu.peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert mfu.peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") == 19.5
    assert mfu.peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None  # no bf16 on Volta
    cpu = mfu.compute(flops_per_sample=100, samples_per_s=10, gpu=None, precision="fp32", processes=1)
    assert cpu.mfu is None and cpu.achieved_tflops == pytest.approx(1e-9)


def test_a_run_launched_elsewhere_on_two_nodes_counts_the_gpus_of_both(client: TestClient) -> None:
    """Its job said 4 ranks, 2 a node: MFU is over 4 GPUs' peak (it was over 2, the processes of one node, before)."""
    joined = client.post("/api/runs/external", json={"key": "job-2n", "name": "two nodes", "rank": 0, "world_size": 4,
                                                     "local_world_size": 2, "host": "node-a"}).json()  # fmt: skip
    h100 = wire.Node(
        "node-a", (wire.Gpu(0, "GPU-a0", "NVIDIA H100 80GB HBM3"), wire.Gpu(1, "GPU-a1", "NVIDIA H100 80GB HBM3"))
    )
    batch = wire.Batch((wire.Point(wire.MODEL_FLOPS_KEY, 1, 457_728.0),), node=h100,
                       progress=wire.Progress(epoch=0, epochs=0, step=1, total_steps=0, samples_per_s=1e6))  # fmt: skip
    posted = client.post(f"/api/runs/{joined['run_id']}/metrics", json=batch.to_json(),
                         headers={"Authorization": f"Bearer {joined['token']}"})  # fmt: skip
    assert posted.status_code == 200, posted.text
    shown = client.get(f"/api/runs/{joined['run_id']}/mfu").json()
    assert shown["processes"] == 4
    assert shown["mfu"] == pytest.approx(0.457728 / (4 * 66.9))  # at fp32: its precision is not known


def test_a_slurm_run_has_its_processes_per_node_times_its_nodes_times_their_agents(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, shared_dir=tmp_path / "shared", slurm_agents_per_node=2)
    run = Run(nproc_per_node=4, slurm_nodes=3, launcher="slurm")
    assert SlurmLauncher(settings, RunFolders(settings.shared)).world_size(run) == 24
    assert SlurmLauncher.ranks(run) == 12, "a run stored before runs kept their size: the agents were never known"
    run.world_size = 24  # as the launcher recorded it
    assert SlurmLauncher.ranks(run) == 24
