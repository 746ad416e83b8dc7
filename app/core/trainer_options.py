"""The built-in trainer's options: the server's twin of `trainer.config.TrainConfig` (which `app` may not import).

A test holds the two equal, field by field: names, types, defaults, bounds and choices
(tests/app/test_run_options.py). A built-in run stores these options as its config document (`Run.config`), the
launcher turns that document into the trainer's flags, and the New-run form, the API's RunCreate and RunOut, the
runs table and the compare page read them from here: a new option is a field of TrainConfig and its twin here (with
a form label in app/web/forms.py if its name does not read well), and nothing else.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator
from rankboard import wire

from app.core.request_body import Body, one_of

# The trainer's choices (from `wire`), each listed as an enum in the schema, so that the form offers them.
OptimizerName = Annotated[str, one_of(wire.OPTIMIZERS), Field(json_schema_extra={"enum": list(wire.OPTIMIZERS)})]


ScheduleName = Annotated[str, one_of(wire.LR_SCHEDULES), Field(json_schema_extra={"enum": list(wire.LR_SCHEDULES)})]


PrecisionName = Annotated[str, one_of(wire.PRECISIONS), Field(json_schema_extra={"enum": list(wire.PRECISIONS)})]


UnitName = Annotated[str, one_of(wire.CHECKPOINT_UNITS), Field(json_schema_extra={"enum": list(wire.CHECKPOINT_UNITS)})]


PreflightMode = Annotated[
    str, one_of(wire.PREFLIGHT_MODES), Field(json_schema_extra={"enum": list(wire.PREFLIGHT_MODES)})
]


# What keep-best ranks checkpoints by (wire.CHECKPOINT_METRICS; a test keeps the two the same).
BestMetric = Literal["loss", "epoch_loss"]


# See trainer/config.py for why these bounds.
MAX_STEP_COUNT = 1_000_000_000
MAX_SEED = 2**31 - 1


def _path_or_empty(value: object) -> object:
    return "" if value is None else value  # the API took null for "none" before; the trainer's "none" is ""


class TrainerOptions(Body):
    """The built-in trainer's options, with the limits the form shows next to each field."""

    epochs: int = Field(default=10, ge=1, le=100_000, description="Passes over the data set.")
    batch_size: int = Field(default=64, ge=1, le=65_536, description="Samples per step on each process.")
    grad_accum: int = Field(
        default=1, ge=1, le=1024, description="Micro-batches per optimizer step; only the last one all-reduces."
    )
    lr: float = Field(default=0.001, gt=0, le=10, description="The peak learning rate, after warm-up.")
    optimizer: OptimizerName = Field(default="adamw", description="SGD uses momentum 0.9.")
    lr_schedule: ScheduleName = Field(
        default="constant", description="After the warm-up: constant, or a cosine decay to 0 at the last step."
    )
    warmup_steps: int = Field(default=0, ge=0, le=MAX_STEP_COUNT, description="Steps of linear warm-up from 0 to lr.")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="The optimizer's decay.")
    grad_clip: float = Field(default=0.0, ge=0, le=1e6, description="Clip the gradient norm to this; 0: no clipping.")
    precision: PrecisionName = Field(
        default="off", description="Mixed precision: bf16, or fp16 with a gradient scaler (CUDA only)."
    )
    val_every: int = Field(
        default=0, ge=0, le=MAX_STEP_COUNT, description="Validate every N steps (loss and accuracy); 0: never."
    )
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="The same seed on every rank; same seed, same run.")
    checkpoint_every: int = Field(
        default=1, ge=1, le=100_000, description="Write a checkpoint every N epochs or steps (see its unit)."
    )
    checkpoint_unit: UnitName = Field(default="epoch", description="What 'checkpoint every' counts.")
    keep_last: int = Field(default=0, ge=0, le=10_000, description="Keep the newest N checkpoints; 0 keeps all.")
    keep_best: int = Field(default=0, ge=0, le=10_000, description="Also keep the N best by the best metric.")
    best_metric: BestMetric = Field(
        default="loss", description="Lower is better: the last step's loss, or the epoch's mean loss."
    )
    init_from: Annotated[str, BeforeValidator(_path_or_empty)] = Field(
        default="", max_length=1000, description="Start from this checkpoint's weights (a path in the shared folder)."
    )
    init_optimizer: bool = Field(default=False, description="With a checkpoint to start from: take its optimizer too.")
    pg_timeout_s: int = Field(
        default=60, ge=5, le=86_400, description="Seconds a collective waits for a dead or hung rank before failing."
    )
    preflight: PreflightMode = Field(
        default="warn",
        description="Before the first step, compare the ranks' software versions and GPUs and time an all-reduce; "
        "refuse: stop the run when a rank differs or is far slower.",
    )
    sync_batchnorm: bool = Field(default=False, description="BatchNorm statistics over all ranks (CUDA only).")
    find_unused_parameters: bool = Field(
        default=False, description="For models whose forward skips parameters; costs time on every step."
    )
    bucket_cap_mb: int = Field(default=25, ge=1, le=1024, description="DDP gradient bucket size, in MiB.")
    gradient_as_bucket_view: bool = Field(default=False, description="Gradients as views into DDP's buckets.")
    fingerprint_every: int = Field(
        default=100, ge=0, le=MAX_STEP_COUNT, description="Compare a fingerprint of every rank's parameters every "
        "this many steps (0: never); a rank whose replica diverged is named with the step. Built-in trainer only.",
    )  # fmt: skip
    desync_checks: bool = Field(
        default=False, description="TORCH_DISTRIBUTED_DEBUG=DETAIL: a monitored barrier before every collective names "
        "the rank that does not reach it. Costs a collective per collective: for a re-run of a hung run.",
    )  # fmt: skip
    stop_on_nonfinite: bool = Field(
        default=False, description="Stop at the first NaN or infinite loss or gradient norm, checkpointing the last "
        "finite step; the run page names the step and the rank where it began either way.",
    )  # fmt: skip

    @field_validator("init_optimizer")
    @classmethod
    def _optimizer_needs_a_checkpoint(cls, value: bool, info: ValidationInfo) -> bool:
        # As the trainer refuses it, and at this field, which the form marks: init_from is checked before it.
        if value and "init_from" in info.data and not info.data["init_from"]:
            raise ValueError("init_optimizer needs init_from: the optimizer state comes from that checkpoint")
        return value


OPTION_NAMES = tuple(TrainerOptions.model_fields)


def options_of(config: dict[str, object] | None) -> dict[str, object]:
    """The trainer options in a stored config document, as stored (none it lacks: a run shows none it never had)."""
    return {name: value for name, value in (config or {}).items() if name in TrainerOptions.model_fields}
