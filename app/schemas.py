"""The shapes of the REST API: what it accepts (with the limits each field has) and what it answers."""

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
    PlainSerializer,
    StringConstraints,
    model_validator,
)
from rankboard import wire

from app.core.models import RunStatus


class Body(BaseModel):
    """What every request body shares: an unknown field, a non-finite number where it is not data (NaN or 1e400 as a
    learning rate, a time, a rate) and a value of the wrong JSON type (`true` for an integer, `0` for a boolean, `1.0`
    for a count) are refused with a 422 naming the field, never coerced. A field that takes strings meaning numbers
    (the form's) is parsed with `strict=False`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


def _known_workload(name: str) -> str:
    if name not in wire.WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of: {', '.join(wire.WORKLOADS)}")
    return name


WorkloadName = Annotated[str, AfterValidator(_known_workload), Field(json_schema_extra={"enum": list(wire.WORKLOADS)})]


def _metric_value(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return wire.decode_value(value) if isinstance(value, str) else value


# A metric value: a JSON number, or "NaN" / "Infinity" / "-Infinity", which JSON cannot write as numbers.
MetricValue = Annotated[
    float,
    Field(allow_inf_nan=True),
    BeforeValidator(_metric_value),
    PlainSerializer(wire.encode_value, return_type=Any),
]


def _one_of(choices: tuple[str, ...]) -> AfterValidator:
    def check(value: str) -> str:
        if value not in choices:
            raise ValueError(f"choose one of: {', '.join(choices)} (got {value!r})")
        return value

    return AfterValidator(check)


# The trainer's choices (from `wire`), each listed as an enum in the schema, so that the form offers them.
OptimizerName = Annotated[str, _one_of(wire.OPTIMIZERS), Field(json_schema_extra={"enum": list(wire.OPTIMIZERS)})]
ScheduleName = Annotated[str, _one_of(wire.LR_SCHEDULES), Field(json_schema_extra={"enum": list(wire.LR_SCHEDULES)})]
PrecisionName = Annotated[str, _one_of(wire.PRECISIONS), Field(json_schema_extra={"enum": list(wire.PRECISIONS)})]
UnitName = Annotated[
    str, _one_of(wire.CHECKPOINT_UNITS), Field(json_schema_extra={"enum": list(wire.CHECKPOINT_UNITS)})
]
PreflightMode = Annotated[
    str, _one_of(wire.PREFLIGHT_MODES), Field(json_schema_extra={"enum": list(wire.PREFLIGHT_MODES)})
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


class PointIn(Body):
    key: Annotated[str, StringConstraints(min_length=1, max_length=wire.MAX_KEY_LENGTH)]
    step: int = Field(ge=0, le=wire.MAX_STEP)
    value: MetricValue
    rank: int = Field(default=0, ge=0, le=wire.MAX_RANK)
    time: float = 0.0


Step = Annotated[int, Field(ge=0, le=wire.MAX_STEP)]


def _non_finite_names(values: Any) -> Any:
    """NaN and infinities written as strings (as the per-point format writes them) made floats; anything else is
    left to the strict check, which takes no other string (nor true)."""
    if isinstance(values, list) and any(type(value) is str for value in values):
        return [wire.NON_FINITE.get(value, value) if type(value) is str else value for value in values]
    return values


class ColumnIn(Body):
    """The points of one metric from one rank, as equally long arrays: the compact format (`wire.Column`)."""

    key: Annotated[str, StringConstraints(min_length=1, max_length=wire.MAX_KEY_LENGTH)]
    rank: int = Field(default=0, ge=0, le=wire.MAX_RANK)
    steps: list[Step] = Field(max_length=wire.MAX_POINTS_PER_BATCH)
    # Numbers, with NaN/Infinity/-Infinity written bare (as Python's json writes them) or as strings.
    values: Annotated[list[Annotated[float, Field(allow_inf_nan=True)]], BeforeValidator(_non_finite_names)] = Field(
        max_length=wire.MAX_POINTS_PER_BATCH
    )
    times: list[float] = Field(max_length=wire.MAX_POINTS_PER_BATCH)

    @model_validator(mode="after")
    def _equally_long(self) -> ColumnIn:
        if not len(self.steps) == len(self.values) == len(self.times):
            raise ValueError(f"steps, values and times must be equally long (got {len(self.steps)}, "
                             f"{len(self.values)} and {len(self.times)})")  # fmt: skip
        return self


class ProgressIn(Body):
    epoch: int = Field(ge=0, le=wire.MAX_EPOCH)
    epochs: int = Field(ge=0, le=wire.MAX_EPOCH)
    step: int = Field(ge=0, le=wire.MAX_STEP)
    total_steps: int = Field(ge=0, le=wire.MAX_STEP)
    samples_per_s: float = Field(default=0.0, ge=0)
    finished: bool = False
    restart: int = Field(default=0, ge=0, le=1_000_000)


HostName = Annotated[str, StringConstraints(min_length=1, max_length=wire.MAX_HOST_LENGTH)]


class GpuIn(Body):
    index: int = Field(ge=0, le=1023)
    uuid: str = Field(max_length=100)
    name: str = Field(max_length=200)


class NodeIn(Body):
    """One node's GPU inventory (`wire.Node`): its GPUs, or why NVML gave none."""

    host: HostName
    gpus: list[GpuIn] = Field(default_factory=list, max_length=wire.MAX_GPUS_PER_NODE)
    nvml_error: str | None = Field(default=None, max_length=wire.MAX_NVML_ERROR_LENGTH)


class HeartbeatIn(Body):
    """One rank's "alive at this step" (`wire.Heartbeat`)."""

    rank: int = Field(ge=0, le=wire.MAX_RANK)
    host: HostName
    step: int = Field(ge=0, le=wire.MAX_STEP)


class EndedIn(Body):
    """How one process of a run launched elsewhere ended (`wire.Ended`)."""

    rank: int = Field(ge=0, le=wire.MAX_RANK)
    host: HostName
    how: Annotated[str, _one_of(wire.ENDINGS)]
    error: Annotated[str, StringConstraints(max_length=2000)] | None = None


class BatchIn(Body):
    """A batch of metric points from a trainer, with its progress, node inventory and heartbeat (`rankboard.wire`)."""

    points: list[PointIn] = Field(default_factory=list, max_length=wire.MAX_POINTS_PER_BATCH)
    columns: list[ColumnIn] = Field(default_factory=list, max_length=wire.MAX_POINTS_PER_BATCH)
    progress: ProgressIn | None = None
    node: NodeIn | None = None
    heartbeat: HeartbeatIn | None = None
    ended: EndedIn | None = None

    @model_validator(mode="after")
    def _at_most_a_batch(self) -> BatchIn:
        if self.size > wire.MAX_POINTS_PER_BATCH:
            raise ValueError(f"{self.size} points; a batch holds at most {wire.MAX_POINTS_PER_BATCH}")
        return self

    @property
    def size(self) -> int:
        """How many points the batch carries, in either format."""
        return len(self.points) + sum(len(column.steps) for column in self.columns)


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


class ErrorOut(BaseModel):
    """A domain error: what cannot be done, and why, in the user's words."""

    detail: str


class IngestResult(BaseModel):
    accepted: int = Field(description="Points in the batch.")
    stored: int = Field(description="Points that were new; the rest were already stored (a retry).")
    stop: bool = Field(default=False, description="A run launched elsewhere was asked to stop (report.stop_requested).")
    dump: int | None = Field(None, description="A dump request each rank should answer once; absent when none.")


class PointOut(BaseModel):
    step: int
    rank: int
    value: MetricValue
    time: float


class SeriesOut(BaseModel):
    key: str
    points: list[PointOut]
    next_step: int | None = Field(description="Pass as start_step for the next page; null on the last page.")
    next_rank: int | None = Field(
        description="Pass as start_rank with next_step. 0 when the page ends at a whole step (as it does whenever "
        "limit holds at least one whole step); otherwise the rank of next_step where the next page starts. Null on "
        "the last page."
    )


class CheckpointOut(BaseModel):
    name: str
    path: str = Field(description="Relative to the shared directory; pass it to /api/files/download or /inspect.")
    size: int
    modified: datetime
    step: int
    epoch: int | None = None
    metrics: dict[str, MetricValue] = Field(default_factory=dict, description="The trainer's metrics at save time.")
    reason: str | None = Field(
        default=None, description=f"Why it was written: one of {', '.join(wire.CHECKPOINT_REASONS)}."
    )
    latest: bool = False
    best: bool = Field(default=False, description="Lowest value of the chosen metric (best_metric) so far.")


class CheckpointRemoval(BaseModel):
    """One checkpoint the retention policy deleted, as the trainer logged it."""

    removed: str
    step: int
    freed: int
    at: float


class Deletion(BaseModel):
    files: list[str]
    freed: int = Field(description="Bytes the deletion frees (or would free, in a dry run).")
    deleted: bool = Field(description="False for a dry run: nothing was deleted.")


class TensorOut(BaseModel):
    name: str
    shape: list[int]
    dtype: str
    numel: int


class Inspection(BaseModel):
    """What a checkpoint holds, read without running any code in it."""

    path: str
    size: int
    keys: dict[str, str] = Field(description="Each top-level key with a short description of its value.")
    tensors: list[TensorOut]
    parameters: int | None = Field(description="Elements of the tensors under 'model'; null without a model.")
    truncated: bool = False


class DiskOut(BaseModel):
    total: int
    used: int
    free: int


class EntryOut(BaseModel):
    name: str
    path: str
    is_dir: bool
    size: int
    size_complete: bool
    modified: datetime


class FolderOut(BaseModel):
    path: str
    entries: list[EntryOut]
    disk: DiskOut


class GpuHolderOut(BaseModel):
    """A run that holds a GPU: it was given the GPU (`devices`), or one of its processes uses it (NVML)."""

    run_id: int
    name: str
    status: RunStatus
    by_devices: bool = Field(description="The launcher gave the run this GPU.")
    memory: int = Field(description="Bytes of GPU memory its processes hold, as NVML lists them.")


class GpuProcessOut(BaseModel):
    pid: int
    memory: int
    run_id: int | None = Field(description="The run the process belongs to; null for anyone else's.")


class HostGpuOut(BaseModel):
    """One GPU of this server's host, now. A value NVML could not read is null, with the reason in `errors`."""

    index: int
    uuid: str
    name: str
    util: float | None = Field(description="Percent of the last sample period a kernel ran.")
    mem_used: float | None = Field(description="Bytes.")
    mem_total: float | None = Field(description="Bytes.")
    temp: float | None = Field(description="°C.")
    power: float | None = Field(description="Watts.")
    power_limit: float | None = Field(description="Watts.")
    sm_clock: float | None = Field(description="MHz.")
    processes: list[GpuProcessOut]
    held_by: list[GpuHolderOut]
    errors: dict[str, str]


class HostOut(BaseModel):
    """This server's host: its GPUs, or why NVML found none, and its CPU and memory."""

    host: str
    nvml_error: str | None = Field(description="Why there are no GPUs: NVML's own reason; null when NVML works.")
    gpus: list[HostGpuOut]
    cpu_percent: float | None = Field(
        description="Busy percent of all cores since the previous reading; null on the first look (nothing measured "
        "yet) and without psutil."
    )
    mem_used: float | None
    mem_total: float | None


class ChartRankOut(BaseModel):
    """One rank's buckets, by step: each bucket's last step, and its min, max (ignoring NaN) and last value."""

    step: list[int] = Field(description="The highest step in each bucket: where its `last` value was reported.")
    min: list[MetricValue] = Field(description='"NaN" for a bucket that holds only NaN.')
    max: list[MetricValue] = Field(description='"NaN" for a bucket that holds only NaN.')
    last: list[MetricValue] = Field(description="The value at the bucket's highest step.")


class ChartOut(BaseModel):
    """A series downsampled for a chart: at most `width` buckets per rank, each with its min, max and last value."""

    key: str
    start_step: int
    end_step: int
    bucket_steps: int = Field(
        description="Steps per bucket: 1 when the range has no more steps than the width; otherwise rounded up to a "
        "whole pre-aggregated tier (a multiple of 16), and buckets then start at start_step rounded down to that tier."
    )
    ranks: dict[str, ChartRankOut] = Field(description="Per rank (as a string), its buckets; empty without points.")


class StalledRankOut(BaseModel):
    """A rank whose heartbeat went stale."""

    rank: int
    host: str
    step: int = Field(description="The last step the rank reported.")
    heartbeat_at: datetime
    silent_s: float = Field(description="Seconds since that heartbeat.")


class GpuSpinOut(BaseModel):
    """GPUs busy but drawing little power over the last 30 s: means over those that show it."""

    gpus: int = Field(description="How many GPUs show it ...")
    of: int = Field(description="... of how many with util and power samples in the window.")
    util: float = Field(description="%")
    power: float = Field(description="W")
    power_limit: float = Field(description="W")


class RankOut(BaseModel):
    """One rank's own last heartbeat, and how its process ended (runs launched elsewhere)."""

    model_config = ConfigDict(from_attributes=True)

    rank: int
    host: str
    step: int
    heartbeat_at: datetime
    ended: str | None = Field(description="A run launched elsewhere: finished, exited or failed; null while it runs.")


class HealthOut(BaseModel):
    """Whether a running run progresses; "ok" for a run in any other state."""

    state: Literal["ok", "not_progressing", "hung_collective"]
    message: str = Field(description="The sentence a person reads; empty when ok.")
    stalled: list[StalledRankOut]
    behind: list[int] = Field(description="Ranks whose last step is below the highest rank's.")
    gpu: GpuSpinOut | None = Field(description="The hung-collective signature, when that is what the GPUs show.")
    stragglers: list[StragglerOut] = Field(
        default_factory=list, description="Ranks still slow in data wait or compute against the others; see findings."
    )


class FrameIn(Body):
    file: str = Field(max_length=1000)
    line: int = Field(ge=0)
    function: str = Field(max_length=1000)


class CollectiveIn(Body):
    seq: int = Field(ge=0)
    name: str = Field(max_length=200)
    sizes: str = Field(max_length=1000)


class RankDumpIn(Body):
    """One rank's answer to a dump request; see `rankboard.wire.RankDump`."""

    request: int = Field(ge=1)
    rank: int = Field(ge=0, le=wire.MAX_RANK)
    host: str = Field(max_length=wire.MAX_HOST_LENGTH)
    pid: int = Field(ge=0)
    taken_at: float
    stack: list[FrameIn] = Field(max_length=wire.MAX_DUMP_FRAMES)
    threads: str = Field(max_length=wire.MAX_DUMP_BYTES)
    collectives: list[CollectiveIn] = Field(default_factory=list, max_length=wire.MAX_DUMP_COLLECTIVES)
    recorder_error: str | None = Field(None, max_length=1000)
    step: int | None = Field(None, ge=0, le=wire.MAX_STEP)
    watched_s: float | None = Field(None, ge=0, le=3600)
    moved: bool | None = None


class DumpRequested(BaseModel):
    request: int = Field(description="The request's number; GET .../dumps shows the ranks' answers.")


class RankStateOut(BaseModel):
    """One rank as its dump shows it."""

    rank: int
    host: str
    pid: int
    taken_at: float
    collective: str | None = Field(description="The collective its main thread is inside (all_reduce), or None.")
    last_seq: int | None = Field(description="Its flight recorder's newest collective sequence number.")
    last_collective: str | None
    where: str = Field(description="Its innermost frame in the script's own code: file:line in function.")
    top: list[str] = Field(description="Its main thread's innermost frames, most recent first.")
    threads: str = Field(description="Every thread's stack, as faulthandler prints it.")
    recorder_error: str | None
    step: int | None = Field(description="Its newest heartbeat step when its stack was taken.")
    progress: Literal["moved", "still", "unknown"] = Field(
        description="moved: its collectives or its step went on in the seconds after its stack, or it reported a "
        "newer step since; still: neither went on while it watched; unknown: it had neither to watch."
    )
    watched_s: float | None = Field(description="How long it watched itself after its stack; it stops at a move.")


class DumpOut(BaseModel):
    """The newest dump of a run's ranks, and who it points at."""

    request: int
    requested_at: datetime | None
    expected: int = Field(description="How many ranks the run has.")
    ranks: list[RankStateOut]
    missing: list[int] = Field(description="Ranks that have not answered.")
    culprits: list[int] = Field(
        description="The ranks the others wait for: named only when no rank moved on and all were seen at one moment."
    )
    verdict: str = Field(description="The sentence a person reads.")


class NonFiniteOut(BaseModel):
    """Where the loss first became NaN or infinite."""

    step: int | None = Field(description="The first step with a non-finite loss; None if only the norm was.")
    ranks: list[int] = Field(description="The ranks whose own loss was non-finite at that step.")
    grad_norm_step: int | None = Field(description="The first step with a non-finite gradient norm.")
    sentence: str


class StragglerOut(BaseModel):
    """A rank whose data wait or compute stayed above the other ranks' over several reports."""

    rank: int
    host: str
    part: Literal["data wait", "compute"]
    ms: float = Field(description="Its mean time in that part, per step, over the episode.")
    others_ms: float = Field(description="The other ranks' median over the same reports.")
    since_step: int
    since: datetime
    until_step: int | None = Field(description="The report it caught up at; None while it is still slow.")
    ongoing: bool
    sentence: str


class DivergenceOut(BaseModel):
    """The first fingerprint step at which some ranks' parameters differed from the others'."""

    step: int
    ranks: list[int]
    sentence: str


class FindingsOut(BaseModel):
    """What the ranks' reports say went wrong, and where."""

    nonfinite: NonFiniteOut | None = Field(None, description="The first non-finite loss; None while all were finite.")
    stragglers: list[StragglerOut] = Field(default_factory=list, description="Ongoing first, then past episodes.")
    divergence: DivergenceOut | None = Field(None, description="Replicas that diverged; None while they agree.")


class DumpsOut(BaseModel):
    latest: DumpOut | None = Field(description="The newest request's answers; None before any request.")


class AlertDeliveryOut(BaseModel):
    """One alert sent (or being sent) to one webhook."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    run_id: int | None = Field(description="None: an alert of the server's own (the shared disk).")
    condition: str
    webhook: str = Field(description="The rule's name, or its host and a short hash; never the URL.")
    url_host: str
    status: Literal["pending", "sent", "failed"]
    attempts: int
    last_error: str
    http_status: int | None
    created_at: datetime
    finished_at: datetime | None


class WebhookOut(BaseModel):
    name: str
    host: str
    format: Literal["json", "slack"]
    events: list[str]


class AlertsOut(BaseModel):
    """The alert rules (from the settings) and the newest deliveries."""

    webhooks: list[WebhookOut]
    conditions: list[str] = Field(description="What a rule may name.")
    not_yet_available: list[str] = Field(description="Conditions the server cannot tell yet.")
    disk_free_percent: float
    deliveries: list[AlertDeliveryOut]


class RunLabels(Body):
    """What PATCH /api/runs/{id} changes; a field left out stays as it is."""

    tags: list[Annotated[str, StringConstraints(max_length=64)]] | None = Field(default=None, max_length=50)
    notes: str | None = Field(default=None, max_length=10_000)
    archived: bool | None = None


class BulkIn(Body):
    """One action on many runs."""

    runs: list[Annotated[int, Field(ge=1, le=2**31 - 1)]] = Field(min_length=1, max_length=500)
    action: Literal["tag", "untag", "archive", "unarchive", "delete"]
    tag: Annotated[str, StringConstraints(max_length=64)] | None = None


class BulkOut(BaseModel):
    done: list[int] = Field(description="The runs acted on.")
    refused: dict[str, str] = Field(default_factory=dict, description="Per run id, why it was not (delete only).")


class RunFolderOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    path: str = Field(description="Relative to the shared folder.")
    bytes: int


class RunDeletionOut(BaseModel):
    """What deleting a run removes (dry_run) or removed."""

    model_config = ConfigDict(from_attributes=True)

    run_id: int
    name: str
    points: int
    folders: list[RunFolderOut] = Field(description="The run's own folders (with files=true), and their sizes.")
    bytes: int
    deleted: bool


class ComparedRunOut(BaseModel):
    """One compared run, as the comparison's summary shows it."""

    id: int
    name: str
    status: RunStatus
    step: int
    total_steps: int
    duration_s: float | None = Field(description="Since its latest launch, up to its end; null before any launch.")
    tags: list[str]


class ComparedOptionOut(BaseModel):
    name: str
    values: list[str] = Field(description="Each run's value, in the runs' order, as the New-run form writes it.")
    differs: bool


class ComparedMetricOut(BaseModel):
    """A metric every compared run has: each run's last value, minimum and maximum, in the runs' order."""

    key: str
    last: list[MetricValue | None]
    min: list[MetricValue | None]
    max: list[MetricValue | None]


class CompareOut(BaseModel):
    """What the compare page shows; its charts read GET /api/runs/{id}/chart?key=... for each run and metric."""

    runs: list[ComparedRunOut]
    options: list[ComparedOptionOut]
    metrics: list[ComparedMetricOut] = Field(description="The metrics every one of the runs has, by key.")
