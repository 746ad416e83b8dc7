"""What a run can train: a registry of workloads, each a dataset and a model built in-process.

A workload builds its data itself (nothing is downloaded) and identically on every rank, so a compute node needs
only torch. Add one by writing two builders and registering them in `WORKLOADS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset

# The task is the same for every run and every seed, so loss curves of runs with different seeds are comparable;
# the run's seed only decides the student's initial weights and the order of the samples.
_DATA_SEED = 20_240_601
_SAMPLES = 65_536
_FEATURES = 32
_CLASSES = 10
_LABEL_NOISE = 0.05


@dataclass(frozen=True)
class Workload:
    """A training task: how to build its dataset, its model and its loss."""

    build_dataset: Callable[[], TensorDataset]
    build_model: Callable[[], nn.Module]
    loss: Callable[[Tensor, Tensor], Tensor]


def teacher_dataset() -> TensorDataset:
    """Gaussian inputs labelled by a fixed random MLP ("teacher"), with a little label noise."""
    generator = torch.Generator().manual_seed(_DATA_SEED)
    inputs = torch.randn(_SAMPLES, _FEATURES, generator=generator)
    hidden = torch.randn(_FEATURES, 64, generator=generator) / _FEATURES**0.5
    readout = torch.randn(64, _CLASSES, generator=generator) / 64**0.5
    labels = (torch.tanh(inputs @ hidden) @ readout).argmax(dim=1)
    # Noise keeps the best reachable loss above zero, as on real data, so a flat curve near 0 means a bug.
    noisy = torch.rand(_SAMPLES, generator=generator) < _LABEL_NOISE
    labels[noisy] = torch.randint(_CLASSES, (int(noisy.sum()),), generator=generator)
    return TensorDataset(inputs, labels)


def mlp_student() -> nn.Module:
    """The model that learns the teacher's labels; it has more capacity than the teacher, so it can."""
    return nn.Sequential(
        nn.Linear(_FEATURES, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, _CLASSES),
    )


WORKLOADS: dict[str, Workload] = {
    "mlp": Workload(build_dataset=teacher_dataset, build_model=mlp_student, loss=F.cross_entropy),
}
