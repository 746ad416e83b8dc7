"""What a run can train: a registry of workloads, each a dataset pair and a model built in-process.

A workload builds its data itself (nothing is downloaded) and identically on every rank, so a compute node needs
only torch. The data of every workload comes from a fixed seed, the same for every run: loss curves of runs with
different seeds are comparable, and the run's seed decides only the initial weights and the order of the samples.
Each workload has a reason to exist:

- `mlp`: the cheapest; a classifier whose curve shows quickly whether the plumbing works.
- `cnn`: convolutions with BatchNorm, whose statistics are per rank unless SyncBatchNorm is on.
- `charlm`: a small causal transformer over characters, where mixed precision and tokens/s matter.

Add one by writing its builders and registering it in `WORKLOADS` (and its description in `wire.WORKLOADS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from rankboard import wire
from torch import Tensor, nn
from torch.utils.data import TensorDataset

_DATA_SEED = 20_240_601
_CLASSES = 10
_LABEL_NOISE = 0.05  # keeps the best reachable loss above zero, as on real data: a flat curve near 0 means a bug


@dataclass(frozen=True)
class Workload:
    """A training task: its (train, validation) datasets, its model, its loss, and how to count correct answers."""

    build_data: Callable[[], tuple[TensorDataset, TensorDataset]]
    build_model: Callable[[], nn.Module]
    loss: Callable[[Tensor, Tensor], Tensor]
    tokens_per_sample: int = 0  # for language models: tokens/s is samples/s times this
    flops_per_sample: int = 0  # model FLOPs of one training sample (forward and backward), for MFU: see model_flops

    def accuracy(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """The fraction of predictions (classes, or next characters) that match the targets."""
        return (outputs.argmax(dim=-1) == targets).float().mean()


def _split(inputs: Tensor, labels: Tensor, validation: int) -> tuple[TensorDataset, TensorDataset]:
    return TensorDataset(inputs[validation:], labels[validation:]), TensorDataset(
        inputs[:validation], labels[:validation]
    )


def _add_label_noise(labels: Tensor, generator: torch.Generator) -> None:
    noisy = torch.rand(len(labels), generator=generator) < _LABEL_NOISE
    labels[noisy] = torch.randint(_CLASSES, (int(noisy.sum()),), generator=generator)


# mlp: Gaussian inputs labelled by a fixed random MLP (the "teacher").
_MLP_SAMPLES, _MLP_VALIDATION, _FEATURES = 65_536 + 4_096, 4_096, 32


def teacher_data() -> tuple[TensorDataset, TensorDataset]:
    generator = torch.Generator().manual_seed(_DATA_SEED)
    inputs = torch.randn(_MLP_SAMPLES, _FEATURES, generator=generator)
    hidden = torch.randn(_FEATURES, 64, generator=generator) / _FEATURES**0.5
    readout = torch.randn(64, _CLASSES, generator=generator) / 64**0.5
    labels = (torch.tanh(inputs @ hidden) @ readout).argmax(dim=1)
    _add_label_noise(labels, generator)
    return _split(inputs, labels, _MLP_VALIDATION)


def mlp_student() -> nn.Module:
    """More capacity than the teacher, so it can learn the teacher's labels."""
    return nn.Sequential(nn.Linear(_FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, _CLASSES))


# cnn: 16x16 RGB images, each a class's fixed pattern at a random brightness and offset, under noise.
_CNN_SAMPLES, _CNN_VALIDATION, _SIDE = 16_384 + 2_048, 2_048, 16


def pattern_images() -> tuple[TensorDataset, TensorDataset]:
    generator = torch.Generator().manual_seed(_DATA_SEED + 1)
    patterns = torch.randn(_CLASSES, 3, _SIDE, _SIDE, generator=generator)
    labels = torch.randint(_CLASSES, (_CNN_SAMPLES,), generator=generator)
    brightness = torch.rand(_CNN_SAMPLES, 1, 1, 1, generator=generator) * 1.5 + 0.25
    images = patterns[labels] * brightness + 2.0 * torch.randn(_CNN_SAMPLES, 3, _SIDE, _SIDE, generator=generator)
    shifts = torch.randint(-2, 3, (_CNN_SAMPLES,), generator=generator)
    for shift in range(-2, 3):  # the same class appears at different places: convolutions help, a lookup does not
        chosen = shifts == shift
        images[chosen] = torch.roll(images[chosen], shifts=shift, dims=3)
    _add_label_noise(labels, generator)
    return _split(images, labels, _CNN_VALIDATION)


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, _CLASSES),
    )  # fmt: skip


# charlm: text from a fixed order-2 Markov chain over 28 characters, as windows of 64 + 1 characters, each window a
# stretch of the chain from its own random start, generated side by side.
ALPHABET = "abcdefghijklmnopqrstuvwxyz ."
_WINDOWS, _LM_VALIDATION, _CONTEXT = 16_384 + 1_024, 1_024, 64


def markov_text() -> tuple[TensorDataset, TensorDataset]:
    generator = torch.Generator().manual_seed(_DATA_SEED + 2)
    size = len(ALPHABET)
    # Each pair of characters is followed by one of a few likely ones: learnable, yet never certain.
    logits = torch.randn(size * size, size, generator=generator) * 3.0
    cumulative = torch.softmax(logits, dim=-1).cumsum(dim=-1)
    text = torch.empty(_WINDOWS, _CONTEXT + 1, dtype=torch.long)
    text[:, :2] = torch.randint(size, (_WINDOWS, 2), generator=generator)
    draws = torch.rand(_CONTEXT + 1, _WINDOWS, 1, generator=generator)
    for i in range(2, _CONTEXT + 1):
        rows = cumulative[text[:, i - 2] * size + text[:, i - 1]]
        text[:, i] = torch.searchsorted(rows, draws[i]).squeeze(1).clamp(max=size - 1)
    return _split(text[:, :-1].contiguous(), text[:, 1:].contiguous(), _LM_VALIDATION)


class CharTransformer(nn.Module):
    """A causal transformer: each position predicts the next character from those before it."""

    def __init__(self, vocabulary: int = len(ALPHABET), width: int = 128, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.position = nn.Parameter(torch.randn(_CONTEXT, width) / math.sqrt(width))
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary)
        self.mask: Tensor
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(_CONTEXT), persistent=False)

    def forward(self, tokens: Tensor) -> Tensor:
        length = tokens.shape[1]
        hidden = self.embed(tokens) + self.position[:length]
        hidden = self.blocks(hidden, mask=self.mask[:length, :length], is_causal=True)
        return self.head(self.norm(hidden))


def model_flops(macs_per_sample: int) -> int:
    """Training FLOPs of a sample from its forward multiply-accumulates: 2 FLOPs each forward, twice as many
    backward (the gradients of the inputs and of the weights), the "6N" convention MFU is quoted in."""
    return 6 * macs_per_sample


# Multiply-accumulates per sample of the matmuls and convolutions, the FLOPs that count; written out so that they
# can be checked by hand (tests/trainer/test_mfu.py). Norms, activations and the softmax are left out, as usual.
MLP_MACS = _FEATURES * 256 + 256 * 256 + 256 * _CLASSES
CNN_MACS = _SIDE * _SIDE * 32 * 3 * 9 + (_SIDE // 2) ** 2 * 64 * 32 * 9 + 64 * _CLASSES  # two convs (after a pool)


def charlm_macs(width: int = 128, layers: int = 2, vocabulary: int = len(ALPHABET), context: int = _CONTEXT) -> int:
    """Per window: per token, each layer's Q, K, V and output projections (4 d^2) and feed-forward (8 d^2), the
    head (d x vocabulary); and the attention's scores and weighted sum (2 x context x d per token and layer)."""
    per_token = layers * (12 * width * width + 2 * context * width) + width * vocabulary
    return context * per_token


def sequence_loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


WORKLOADS: dict[str, Workload] = {
    "mlp": Workload(
        build_data=teacher_data, build_model=mlp_student, loss=F.cross_entropy, flops_per_sample=model_flops(MLP_MACS)
    ),
    "cnn": Workload(
        build_data=pattern_images, build_model=small_cnn, loss=F.cross_entropy, flops_per_sample=model_flops(CNN_MACS)
    ),
    "charlm": Workload(
        build_data=markov_text,
        build_model=CharTransformer,
        loss=sequence_loss,
        tokens_per_sample=_CONTEXT,
        flops_per_sample=model_flops(charlm_macs()),
    ),
}
assert WORKLOADS.keys() == wire.WORKLOADS.keys(), "describe each workload in wire.WORKLOADS"
