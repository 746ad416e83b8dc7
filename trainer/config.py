"""The trainer's settings: one frozen dataclass, checked when built, whose fields also make the command line.

Each field's bounds and choices are data (`option`), read by its check, by its help on the command line, and by a
test that holds the server's twin of these options (app.core.trainer_options.TrainerOptions) equal to them.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rankboard import wire

from trainer.workloads import WORKLOADS

# A count of steps (warm-up, validation and fingerprint intervals): a billion is longer than any run trains, and it
# stays a 32-bit integer wherever a value is stored or indexed.
MAX_STEP_COUNT = 1_000_000_000
# Seeds as every random generator a script may add takes them (numpy's need < 2**32), and as the server always took.
MAX_SEED = 2**31 - 1


def option(default: Any, help: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
           choices: Sequence[str] = ()) -> Any:  # fmt: skip
    """A field: its default, its help for the person launching a run, and its bounds (`ge`, `gt`, `le`) or
    `choices`, which its check and its help both read."""
    bounds = {name: value for name, value in (("ge", ge), ("gt", gt), ("le", le)) if value is not None}
    return field(default=default, metadata={"help": help, **bounds, **({"choices": tuple(choices)} if choices else {})})


def _checkpoint_dir_from_env() -> str:
    return os.environ.get(wire.ENV_CHECKPOINT_DIR) or "checkpoints"


@dataclass(frozen=True)
class TrainConfig:
    """Train a workload with PyTorch DDP; run it under torchrun, one process per GPU (or per CPU slot)."""

    workload: str = option("mlp", "what to train", choices=sorted(WORKLOADS))
    epochs: int = option(10, "passes over the training set", ge=1, le=100_000)
    batch_size: int = option(64, "samples per step on each rank", ge=1, le=65_536)
    lr: float = option(1e-3, "peak learning rate (after warm-up)", gt=0, le=10)
    optimizer: str = option("adamw", "sgd uses momentum 0.9", choices=wire.OPTIMIZERS)
    lr_schedule: str = option("constant", "after warm-up (cosine decays to 0)", choices=wire.LR_SCHEDULES)
    warmup_steps: int = option(0, "steps of linear warm-up from 0 to lr", ge=0, le=MAX_STEP_COUNT)
    weight_decay: float = option(0.0, "the optimizer's weight decay", ge=0, le=1)
    # Any norm above a million is no clip at all, which 0 already says: the bound refuses a typo such as 1e9.
    grad_clip: float = option(0.0, "clip the gradient norm to this (0: no clipping)", ge=0, le=1e6)
    grad_accum: int = option(1, "micro-batches per optimizer step; only the last one all-reduces", ge=1, le=1024)
    precision: str = option("off", "mixed precision; fp16 needs CUDA", choices=wire.PRECISIONS)
    sync_batchnorm: bool = option(False, "BatchNorm statistics over all ranks (SyncBatchNorm); needs CUDA")
    find_unused_parameters: bool = option(
        False, "DDP: allow parameters the forward pass skips (costs time on every step)"
    )
    bucket_cap_mb: int = option(25, "DDP: gradient bucket size in MiB", ge=1, le=1024)
    gradient_as_bucket_view: bool = option(False, "DDP: gradients are views into the buckets, saving a copy's memory")
    val_every: int = option(0, "validate every this many steps (0: never)", ge=0, le=MAX_STEP_COUNT)
    checkpoint_every: int = option(1, "write a checkpoint every this many units", ge=1, le=100_000)
    checkpoint_unit: str = option("epoch", "what checkpoint-every counts", choices=wire.CHECKPOINT_UNITS)
    seed: int = option(0, "seeds the initial weights and the sample order", ge=0, le=MAX_SEED)
    pg_timeout_s: int = option(60, "seconds a collective may wait for a dead or hung rank", ge=5, le=86_400)
    checkpoint_dir: str = field(
        default_factory=_checkpoint_dir_from_env,
        metadata={"help": f"folder for step-*.pt files; default ${wire.ENV_CHECKPOINT_DIR}, else ./checkpoints"},
    )
    keep_last: int = option(
        0, "after each save, keep the newest this many checkpoints (0 with keep-best 0: all)", ge=0, le=10_000
    )
    keep_best: int = option(
        0, "after each save, also keep this many with the lowest best-metric; the newest stays", ge=0, le=10_000
    )
    best_metric: str = option("loss", "what keep-best ranks by, lower is better", choices=wire.CHECKPOINT_METRICS)
    init_from: str = option("", "a step-*.pt of an earlier run to start from (its weights); step and epoch start at 0")
    init_optimizer: bool = option(
        False, "with init-from, also take its optimizer state (AdamW moments), not only its weights"
    )
    preflight: str = option(
        "warn", "before the first step, compare the ranks' software and all-reduce speed (refuse: stop the run on a "
        "mismatch or a slow rank)", choices=wire.PREFLIGHT_MODES,
    )  # fmt: skip
    resume: bool = option(True, "continue exactly from the newest step-*.pt in checkpoint-dir, if there is one")
    fingerprint_every: int = option(
        100, "compare a fingerprint of every rank's parameters every this many steps (0: never)", ge=0,
        le=MAX_STEP_COUNT,
    )  # fmt: skip
    desync_checks: bool = option(
        False, "a monitored barrier before each step's all-reduce, whose timeout error names the rank that did not "
        "reach it; costs a barrier a step",
    )  # fmt: skip
    stop_on_nonfinite: bool = option(
        False, "stop at the first NaN or infinite loss or gradient norm; checkpoints the last finite step"
    )

    def __post_init__(self) -> None:
        types = typing.get_type_hints(type(self))  # the annotations are strings under `from __future__ import ...`
        for f in dataclasses.fields(self):
            _check(f.name, getattr(self, f.name), types[f.name], f.metadata)
        if not self.checkpoint_dir:
            raise ValueError(f"checkpoint_dir must be a non-empty path, got {self.checkpoint_dir!r}")
        if self.init_optimizer and not self.init_from:
            raise ValueError("init_optimizer needs init_from: the optimizer state comes from that checkpoint")

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> TrainConfig:
        """Parse a command line whose flags are this class's fields (`batch_size` -> `--batch-size`)."""
        parser = cls.argument_parser()
        args = parser.parse_args(argv)
        try:
            return cls(**vars(args))
        except ValueError as error:
            parser.error(str(error))  # exits 2 with the usage, as for any other bad flag

    @classmethod
    def argument_parser(cls) -> argparse.ArgumentParser:
        """The parser `from_argv` uses: one flag per field, with the field's type, default, help and bounds."""
        parser = argparse.ArgumentParser(
            prog="python -m trainer", description=cls.__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
        )
        types = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if callable(f.default_factory) else f.default
            # A bool flag alone means true, and also takes a value, so that `to_argv` can spell out a false.
            kind: dict[str, Any] = (
                {"type": _parse_bool, "nargs": "?", "const": True, "metavar": "true|false"}
                if types[f.name] is bool
                else {"type": types[f.name]}
            )
            parser.add_argument(
                f"--{f.name.replace('_', '-')}", dest=f.name, default=default, help=_help(f.metadata), **kind
            )
        return parser

    def to_argv(self) -> list[str]:
        """The command line that `from_argv` turns back into this config."""
        return [
            arg
            for f in dataclasses.fields(self)
            for arg in (f"--{f.name.replace('_', '-')}", wire.flag_value(getattr(self, f.name)))
        ]

    def needs_cuda(self) -> list[str]:
        """Why the options set here cannot run without CUDA, one line each (none: they can)."""
        options = wire.cuda_only(precision=self.precision, sync_batchnorm=self.sync_batchnorm)
        return [f"{option}: {reason}" for option, reason in options.items()]

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values, fit for a checkpoint that loads with `weights_only=True`."""
        return dataclasses.asdict(self)


def _help(metadata: typing.Mapping[str, Any]) -> str:
    """A field's help with its bounds or choices, as its check reads them."""
    if "choices" in metadata:
        return f"{metadata['help']}; one of {list(metadata['choices'])}"
    low = f">= {metadata['ge']}" if "ge" in metadata else f"> {metadata['gt']}" if "gt" in metadata else ""
    bounds = " and ".join(part for part in (low, f"<= {metadata['le']}" if "le" in metadata else "") if part)
    return f"{metadata['help']}; {bounds}" if bounds else metadata["help"]


def _parse_bool(text: str) -> bool:
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if text.lower() not in words:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return words[text.lower()]


def _check(name: str, value: object, kind: type, metadata: typing.Mapping[str, Any]) -> None:
    """Refuses a value of the wrong type (bool is an int subclass, and `epochs=True` is always a mistake), out of its
    bounds (NaN is in none), or not among its choices, naming the field."""
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
    elif kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
        if "choices" in metadata and value not in metadata["choices"]:
            raise ValueError(f"{name} must be one of {list(metadata['choices'])}, got {value!r}")
    else:
        allowed: tuple[type, ...] = (int,) if kind is int else (int, float)
        low, high = metadata.get("ge", metadata.get("gt", -math.inf)), metadata.get("le", math.inf)
        low_ok = isinstance(value, int | float) and (value > low if "gt" in metadata else value >= low)
        if isinstance(value, bool) or not isinstance(value, allowed) or not (low_ok and value <= high):
            what = "an integer" if kind is int else "a number"
            bounds = f"{'>' if 'gt' in metadata else '>='} {low}" + ("" if high == math.inf else f" and <= {high}")
            raise ValueError(f"{name} must be {what} {bounds}, got {value!r}")
