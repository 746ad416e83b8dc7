"""A run: the options it is created with (and their limits, which the form shows), and how it is shown."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from rankboard import wire

from app.core.models import RunStatus
from app.schemas.common import Body, HostName, MetricValue, one_of
from app.schemas.metrics import NodeIn


def _known_workload(name: str) -> str:
    if name not in wire.WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of: {', '.join(wire.WORKLOADS)}")
    return name


WorkloadName = Annotated[str, AfterValidator(_known_workload), Field(json_schema_extra={"enum": list(wire.WORKLOADS)})]


# The trainer's choices (from `wire`), each listed as an enum in the schema, so that the form offers them.
OptimizerName = Annotated[str, one_of(wire.OPTIMIZERS), Field(json_schema_extra={"enum": list(wire.OPTIMIZERS)})]


ScheduleName = Annotated[str, one_of(wire.LR_SCHEDULES), Field(json_schema_extra={"enum": list(wire.LR_SCHEDULES)})]


PrecisionName = Annotated[str, one_of(wire.PRECISIONS), Field(json_schema_extra={"enum": list(wire.PRECISIONS)})]


UnitName = Annotated[str, one_of(wire.CHECKPOINT_UNITS), Field(json_schema_extra={"enum": list(wire.CHECKPOINT_UNITS)})]


PreflightMode = Annotated[
    str, one_of(wire.PREFLIGHT_MODES), Field(json_schema_extra={"enum": list(wire.PREFLIGHT_MODES)})
]


def _nccl_env(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if name not in wire.NCCL_ENV:
            raise ValueError(f"{name!r} is not an NCCL variable a run may set; allowed: {', '.join(wire.NCCL_ENV)}")
        if len(value) > 1000 or any(c in value for c in "\0\n\r"):
            raise ValueError(f"{name}: the value must be one line of at most 1000 characters")
    return env


def _script_argument(value: str) -> str:
    if "\0" in value:
        raise ValueError("an argument cannot hold a NUL character")
    return value


# What keep-best ranks checkpoints by (wire.CHECKPOINT_METRICS; a test keeps the two the same).
BestMetric = Literal["loss", "epoch_loss"]


LauncherName = Literal["local", "slurm"]


# What Slurm's --time takes: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]].
SLURM_TIME = r"^(\d{1,7}|\d{1,7}:\d{1,2}|\d{1,4}:\d{1,2}:\d{1,2}|\d{1,4}-\d{1,2}(:\d{1,2}){0,2})$"


SLURM_NAME = r"^[A-Za-z0-9_.-]{1,64}$"  # partitions, accounts, QoS: what sites name them, and nothing a shell reads


SLURM_CONSTRAINT = r"^[A-Za-z0-9_.&|,*\[\]()!:-]{1,200}$"  # features joined with & | , [ ] * as sbatch takes them


def _blank_is_none(value: object) -> object:
    return value or None


SlurmTime = Annotated[Annotated[str, StringConstraints(pattern=SLURM_TIME)] | None, BeforeValidator(_blank_is_none)]


SlurmName = Annotated[Annotated[str, StringConstraints(pattern=SLURM_NAME)] | None, BeforeValidator(_blank_is_none)]


SlurmConstraint = Annotated[
    Annotated[str, StringConstraints(pattern=SLURM_CONSTRAINT)] | None, BeforeValidator(_blank_is_none)
]


class RunCreate(Body):
    """A new run of a built-in workload, or of your own script; the form shows these limits next to each field."""

    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)] = Field(
        default="demo", description="What you will recognise the run by."
    )
    workload: WorkloadName = Field(default="mlp", description="The built-in model and synthetic data set to train.")
    script: Annotated[str | None, BeforeValidator(lambda v: v or None)] = Field(
        default=None,
        max_length=1000,
        description="Your own training script instead of a workload: a path in the shared or scripts folder.",
    )
    script_args: list[Annotated[str, StringConstraints(max_length=4096), AfterValidator(_script_argument)]] = Field(
        default_factory=list, max_length=256, description="The script's arguments, one per line."
    )
    nproc_per_node: int = Field(default=2, ge=1, le=1024, description="Processes (one per GPU) on this node.")
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
    warmup_steps: int = Field(default=0, ge=0, le=10_000_000, description="Steps of linear warm-up from 0 to lr.")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="The optimizer's decay.")
    grad_clip: float = Field(default=0.0, ge=0, le=1e6, description="Clip the gradient norm to this; 0: no clipping.")
    precision: PrecisionName = Field(
        default="off", description="Mixed precision: bf16, or fp16 with a gradient scaler (CUDA only)."
    )
    val_every: int = Field(
        default=0, ge=0, le=10_000_000, description="Validate every N steps (loss and accuracy); 0: never."
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="The same seed on every rank; same seed, same run.")
    checkpoint_every: int = Field(
        default=1, ge=1, le=100_000, description="Write a checkpoint every N epochs or steps (see its unit)."
    )
    checkpoint_unit: UnitName = Field(default="epoch", description="What 'checkpoint every' counts.")
    keep_last: int = Field(default=0, ge=0, le=10_000, description="Keep the newest N checkpoints; 0 keeps all.")
    keep_best: int = Field(default=0, ge=0, le=10_000, description="Also keep the N best by the best metric.")
    best_metric: BestMetric = Field(
        default="loss", description="Lower is better: the last step's loss, or the epoch's mean loss."
    )
    init_from: Annotated[str | None, BeforeValidator(lambda v: v or None)] = Field(
        default=None, max_length=1000, description="Start from this checkpoint's weights (a path in the shared folder)."
    )
    init_optimizer: bool = Field(default=False, description="With a checkpoint to start from: take its optimizer too.")
    max_restarts: int = Field(
        default=0, ge=0, le=100, description="Restart the workers this often after a rank dies; they resume exactly."
    )
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
        default=100, ge=0, le=1_000_000_000, description="Compare a fingerprint of every rank's parameters every this "
        "many steps (0: never); a rank whose replica diverged is named with the step. Built-in trainer only.",
    )  # fmt: skip
    desync_checks: bool = Field(
        default=False, description="TORCH_DISTRIBUTED_DEBUG=DETAIL: a monitored barrier before every collective names "
        "the rank that does not reach it. Costs a collective per collective: for a re-run of a hung run.",
    )  # fmt: skip
    stop_on_nonfinite: bool = Field(
        default=False, description="Stop at the first NaN or infinite loss or gradient norm, checkpointing the last "
        "finite step; the run page names the step and the rank where it began either way.",
    )  # fmt: skip
    nccl_env: Annotated[dict[str, str], AfterValidator(_nccl_env)] = Field(
        default_factory=dict, max_length=len(wire.NCCL_ENV), description="NCCL variables, e.g. NCCL_DEBUG=INFO."
    )
    allow_low_disk: bool = Field(
        default=False, description="Start even if its checkpoints are projected not to fit on the shared disk."
    )
    launcher: LauncherName = Field(
        default="local", description="Where to run: on this host, or as a Slurm batch job with the options below."
    )
    slurm_nodes: int = Field(default=1, ge=1, le=4096, description="Slurm: nodes; each runs one torchrun agent.")
    slurm_gpus_per_node: int = Field(default=0, ge=0, le=64, description="Slurm: GPUs on each node (--gpus-per-node).")
    slurm_cpus_per_task: int = Field(default=1, ge=1, le=1024, description="Slurm: CPU cores for each node's agent.")
    slurm_time_limit: SlurmTime = Field(
        default=None, description="Slurm: time limit, e.g. 90, 4:00:00 or 2-00:00:00; empty: the server's default."
    )
    slurm_partition: SlurmName = Field(
        default=None, description="Slurm: partition; empty: the server's default, else the cluster's."
    )
    slurm_account: SlurmName = Field(default=None, description="Slurm: account to charge; empty: the server's default.")
    slurm_qos: SlurmName = Field(default=None, description="Slurm: quality of service.")
    slurm_constraint: SlurmConstraint = Field(default=None, description="Slurm: node features required, e.g. a100&ib.")
    slurm_requeue: bool = Field(default=False, description="Slurm: requeue when preempted or out of time.")
    slurm_max_requeues: int = Field(default=1, ge=0, le=100, description="Slurm: requeues allowed at most.")


class RunEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    at: datetime
    status: RunStatus
    reason: str


class AuditOut(BaseModel):
    """Who did what to a run, and when: created, stopped, resumed, deleted checkpoints."""

    model_config = ConfigDict(from_attributes=True)

    at: datetime
    actor: str = Field(description="A user's name; 'NAME (token T)' for an API token; 'local' with authentication off.")
    action: str
    detail: str


class RunOut(BaseModel):
    """A run as the API shows it."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    status: RunStatus
    status_reason: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    workload: str
    nproc_per_node: int
    epochs: int
    batch_size: int
    lr: float
    checkpoint_every: int
    seed: int
    keep_last: int
    keep_best: int
    best_metric: str
    init_from: str | None
    init_optimizer: bool
    optimizer: str
    lr_schedule: str
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    grad_accum: int
    precision: str
    sync_batchnorm: bool
    find_unused_parameters: bool
    bucket_cap_mb: int
    gradient_as_bucket_view: bool
    stop_on_nonfinite: bool
    fingerprint_every: int
    desync_checks: bool
    val_every: int
    checkpoint_unit: str
    max_restarts: int
    pg_timeout_s: int
    preflight: str
    sweep_of: int | None = Field(description="The run whose scaling sweep this run is part of.")
    nccl_env: dict[str, str] | None
    script: str | None
    script_args: list[str] | None
    restarts: int
    command: list[str] | None
    exit_code: int | None
    epoch: int
    step: int
    total_steps: int
    samples_per_s: float
    heartbeat_at: datetime | None
    final_loss: MetricValue | None
    gpus: list[NodeIn] | None = Field(default=None, description="Each node's GPUs, as its trainer reported them.")
    launcher: str
    slurm_nodes: int
    slurm_gpus_per_node: int
    slurm_cpus_per_task: int
    slurm_time_limit: str | None
    slurm_partition: str | None
    slurm_account: str | None
    slurm_qos: str | None
    slurm_constraint: str | None
    slurm_requeue: bool
    slurm_max_requeues: int
    job_id: str | None = Field(description="A Slurm run's job id.")
    job_state: str | None = Field(description="Slurm's state of the job when last looked at (PENDING, RUNNING...).")
    job_reason: str | None = Field(description="Why Slurm keeps the job waiting (Resources, Priority, BeginTime).")
    node_list: str | None = Field(description="The nodes Slurm gave the job.")
    attempt: int = Field(description="1 once launched; each requeue after Slurm's time-limit warning adds one.")
    created_by: str | None = Field(default=None, description="Who created the run (None: before it was recorded).")
    tags: list[str] = Field(default_factory=list, description="The run's tags.")
    notes: str = Field(default="", description="The user's notes on the run.")
    archived_at: datetime | None = Field(default=None, description="When archived: not in the default list.")
    # Of a run launched elsewhere (launcher "external"); None or false for the others.
    external_key: str | None = Field(default=None, description="The key its processes join by.")
    config: dict[str, Any] | None = Field(default=None, description="What its script said of itself.")
    world_size: int | None = Field(default=None, description="The ranks its job said it has.")
    contact_at: datetime | None = Field(default=None, description="When any of its processes last posted.")
    takes_stop: bool = Field(default=False, description="Its script stops when asked (report.stop_requested).")
    checkpoint_folder: str | None = Field(default=None, description="Where its script saves, in the shared folder.")


class RunDetail(RunOut):
    events: list[RunEventOut]
    audit: list[AuditOut] = Field(description="Who created, stopped, resumed it, or deleted its checkpoints.")


class RunPage(BaseModel):
    items: list[RunOut]
    total: int
    limit: int
    offset: int
    columns: list[str] = Field(default_factory=list, description="The columns asked for, as `columns` named them.")
    values: dict[str, dict[str, float | str | bool | None]] = Field(
        default_factory=dict, description="Per run id, its value of each column (a metric's: None when it has none)."
    )


def _small_config(config: dict[str, Any]) -> dict[str, Any]:
    size = len(json.dumps(config, default=str))
    if size > wire.MAX_CONFIG_BYTES:
        raise ValueError(f"{size} bytes as JSON; at most {wire.MAX_CONFIG_BYTES}")
    return config


class JoinIn(Body):
    """One process of a run launched elsewhere asks to report into its job's run (`wire.Join`)."""

    key: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")] = Field(
        description="What every process of the job shares: its Slurm id, torchrun's rendezvous id, or your own "
        "(printable, no spaces)."
    )
    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
    config: Annotated[dict[str, Any], AfterValidator(_small_config)] = Field(default_factory=dict)
    rank: int = Field(ge=0, le=wire.MAX_RANK)
    world_size: int = Field(ge=1, le=wire.MAX_RANK)
    local_world_size: int = Field(ge=1, le=wire.MAX_RANK)
    host: HostName
    takes_stop: bool = Field(default=False, description="The script reads report.stop_requested() and stops itself.")
    checkpoint_dir: Annotated[str, StringConstraints(max_length=1000)] | None = Field(
        default=None, description="Where the script saves its checkpoints (step-<step>.pt), in the shared folder."
    )

    @model_validator(mode="after")
    def _rank_in_world(self) -> JoinIn:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        return self


class JoinOut(BaseModel):
    run_id: int
    token: str = Field(description="This process's own token for the run's ingest endpoint.")
    created: bool = Field(description="This process's join made the run; the others joined it.")
