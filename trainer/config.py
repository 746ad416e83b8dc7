"""The trainer's settings: one frozen dataclass, checked when built, whose fields also make the command line."""

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


def _checkpoint_dir_from_env() -> str:
    return os.environ.get(wire.ENV_CHECKPOINT_DIR) or "checkpoints"


@dataclass(frozen=True)
class TrainConfig:
    """Train a workload with PyTorch DDP; run it under torchrun, one process per GPU (or per CPU slot)."""

    # Each field's "help" is its documentation; the CLI shows it, so it is written for the person launching a run.
    workload: str = field(default="mlp", metadata={"help": f"what to train, one of {sorted(WORKLOADS)}"})
    epochs: int = field(default=10, metadata={"help": "passes over the training set, 1..100000"})
    batch_size: int = field(default=64, metadata={"help": "samples per step on each rank, 1..65536"})
    lr: float = field(default=1e-3, metadata={"help": "peak learning rate (after warm-up), > 0 and <= 10"})
    optimizer: str = field(default="adamw", metadata={"help": f"one of {list(wire.OPTIMIZERS)}; sgd uses momentum 0.9"})
    lr_schedule: str = field(
        default="constant", metadata={"help": f"after warm-up, one of {list(wire.LR_SCHEDULES)} (cosine decays to 0)"}
    )
    warmup_steps: int = field(default=0, metadata={"help": "steps of linear warm-up from 0 to lr, >= 0"})
    weight_decay: float = field(default=0.0, metadata={"help": "the optimizer's weight decay, 0..1"})
    grad_clip: float = field(default=0.0, metadata={"help": "clip the gradient norm to this, >= 0 (0: no clipping)"})
    grad_accum: int = field(
        default=1, metadata={"help": "micro-batches per optimizer step, 1..1024; only the last one all-reduces"}
    )
    precision: str = field(
        default="off", metadata={"help": f"mixed precision, one of {list(wire.PRECISIONS)}; fp16 needs CUDA"}
    )
    sync_batchnorm: bool = field(
        default=False, metadata={"help": "BatchNorm statistics over all ranks (SyncBatchNorm); needs CUDA"}
    )
    find_unused_parameters: bool = field(
        default=False, metadata={"help": "DDP: allow parameters the forward pass skips (costs time on every step)"}
    )
    bucket_cap_mb: int = field(default=25, metadata={"help": "DDP: gradient bucket size in MiB, 1..1024"})
    gradient_as_bucket_view: bool = field(
        default=False, metadata={"help": "DDP: gradients are views into the buckets, saving a copy's memory"}
    )
    val_every: int = field(default=0, metadata={"help": "validate every this many steps, >= 0 (0: never)"})
    checkpoint_every: int = field(default=1, metadata={"help": "write a checkpoint every this many units, 1..100000"})
    checkpoint_unit: str = field(
        default="epoch", metadata={"help": f"what checkpoint-every counts, one of {list(wire.CHECKPOINT_UNITS)}"}
    )
    seed: int = field(default=0, metadata={"help": "seeds the initial weights and the sample order, >= 0"})
    pg_timeout_s: int = field(
        default=60, metadata={"help": "seconds a collective may wait for a dead or hung rank, 5..86400"}
    )
    checkpoint_dir: str = field(
        default_factory=_checkpoint_dir_from_env,
        metadata={"help": f"folder for step-*.pt files; default ${wire.ENV_CHECKPOINT_DIR}, else ./checkpoints"},
    )
    keep_last: int = field(
        default=0,
        metadata={"help": "after each save, keep the newest this many checkpoints, >= 0 (0 with keep-best 0: all)"},
    )
    keep_best: int = field(
        default=0,
        metadata={"help": "after each save, also keep this many with the lowest best-metric, >= 0; the newest stays"},
    )
    best_metric: str = field(
        default="loss",
        metadata={"help": f"what keep-best ranks by, lower is better: one of {list(wire.CHECKPOINT_METRICS)}"},
    )
    init_from: str = field(
        default="",
        metadata={"help": "a step-*.pt of an earlier run to start from (its weights); step and epoch start at 0"},
    )
    init_optimizer: bool = field(
        default=False,
        metadata={"help": "with init-from, also take its optimizer state (AdamW moments), not only its weights"},
    )
    preflight: str = field(
        default="warn",
        metadata={
            "help": f"before the first step, compare the ranks' software and all-reduce speed: one of "
            f"{list(wire.PREFLIGHT_MODES)} (refuse: stop the run on a mismatch or a slow rank)"
        },
    )
    resume: bool = field(
        default=True,
        metadata={"help": "continue exactly from the newest step-*.pt in checkpoint-dir, if there is one"},
    )
    fingerprint_every: int = field(
        default=100,
        metadata={"help": "compare a fingerprint of every rank's parameters every this many steps, >= 0 (0: never)"},
    )
    desync_checks: bool = field(
        default=False,
        metadata={"help": "a monitored barrier before each step's all-reduce, whose timeout error names the rank that "
                  "did not reach it; costs a barrier a step"},
    )  # fmt: skip
    stop_on_nonfinite: bool = field(
        default=False,
        metadata={"help": "stop at the first NaN or infinite loss or gradient norm; checkpoints the last finite step"},
    )

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {sorted(WORKLOADS)}, got {self.workload!r}")
        _check_int("epochs", self.epochs, 1, 100_000)
        _check_int("batch_size", self.batch_size, 1, 65_536)
        if isinstance(self.lr, bool) or not isinstance(self.lr, int | float) or not 0 < self.lr <= 10:
            raise ValueError(f"lr must be > 0 and <= 10, got {self.lr!r}")
        _check_choice("optimizer", self.optimizer, wire.OPTIMIZERS)
        _check_choice("lr_schedule", self.lr_schedule, wire.LR_SCHEDULES)
        _check_int("warmup_steps", self.warmup_steps, 0, math.inf)
        _check_float("weight_decay", self.weight_decay, 0, 1)
        _check_float("grad_clip", self.grad_clip, 0, math.inf)
        _check_int("grad_accum", self.grad_accum, 1, 1024)
        _check_choice("precision", self.precision, wire.PRECISIONS)
        _check_int("bucket_cap_mb", self.bucket_cap_mb, 1, 1024)
        _check_int("val_every", self.val_every, 0, math.inf)
        _check_int("checkpoint_every", self.checkpoint_every, 1, 100_000)
        _check_choice("checkpoint_unit", self.checkpoint_unit, wire.CHECKPOINT_UNITS)
        _check_choice("preflight", self.preflight, wire.PREFLIGHT_MODES)
        _check_int("seed", self.seed, 0, math.inf)
        _check_int("pg_timeout_s", self.pg_timeout_s, 5, 86_400)
        _check_int("fingerprint_every", self.fingerprint_every, 0, math.inf)
        for flag in ("sync_batchnorm", "find_unused_parameters", "gradient_as_bucket_view", "resume",
                     "stop_on_nonfinite", "desync_checks"):  # fmt: skip
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        if not isinstance(self.checkpoint_dir, str) or not self.checkpoint_dir:
            raise ValueError(f"checkpoint_dir must be a non-empty path, got {self.checkpoint_dir!r}")
        _check_int("keep_last", self.keep_last, 0, math.inf)
        _check_int("keep_best", self.keep_best, 0, math.inf)
        if self.best_metric not in wire.CHECKPOINT_METRICS:
            raise ValueError(f"best_metric must be one of {list(wire.CHECKPOINT_METRICS)}, got {self.best_metric!r}")
        if not isinstance(self.init_from, str):
            raise ValueError(f"init_from must be a path, or empty for none, got {self.init_from!r}")
        if not isinstance(self.init_optimizer, bool):
            raise ValueError(f"init_optimizer must be true or false, got {self.init_optimizer!r}")
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
        """The parser `from_argv` uses: one flag per field, with the field's type, default and help."""
        parser = argparse.ArgumentParser(
            prog="python -m trainer", description=cls.__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
        )
        types = typing.get_type_hints(cls)  # the annotations are strings under `from __future__ import annotations`
        for f in dataclasses.fields(cls):
            default = f.default_factory() if callable(f.default_factory) else f.default
            # A bool flag alone means true, and also takes a value, so that `to_argv` can spell out a false.
            kind: dict[str, Any] = (
                {"type": _parse_bool, "nargs": "?", "const": True, "metavar": "true|false"}
                if types[f.name] is bool
                else {"type": types[f.name]}
            )
            parser.add_argument(
                f"--{f.name.replace('_', '-')}", dest=f.name, default=default, help=f.metadata["help"], **kind
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


def _parse_bool(text: str) -> bool:
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if text.lower() not in words:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return words[text.lower()]


def _check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _check_float(name: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        upper = "" if high == math.inf else f" and <= {high}"
        raise ValueError(f"{name} must be a number >= {low}{upper}, got {value!r}")


def _check_int(name: str, value: object, low: float, high: float) -> None:
    # bool is an int subclass, and `epochs=True` is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        upper = "" if high == math.inf else f" and <= {high}"
        raise ValueError(f"{name} must be an integer >= {low}{upper}, got {value!r}")
