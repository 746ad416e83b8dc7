"""A run: the options it is created with (and their limits, which the form shows), and how it is shown."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    create_model,
    model_validator,
)
from rankboard import wire

from app.core import priorities
from app.core.models import Run, RunStatus
from app.core.request_body import Body
from app.core.trainer_options import OPTION_NAMES, TrainerOptions
from app.core.trainer_options import (
    BestMetric as BestMetric,  # where the checkpoints API and a wire test import it from
)
from app.schemas.common import HostName, MetricValue
from app.schemas.metrics import NodeIn


def _known_workload(name: str) -> str:
    if name not in wire.WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of: {', '.join(wire.WORKLOADS)}")
    return name


WorkloadName = Annotated[str, AfterValidator(_known_workload), Field(json_schema_extra={"enum": list(wire.WORKLOADS)})]


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


def _priority(value: object) -> int:
    if value is None or value == "":  # a form's empty field
        return priorities.NORMAL
    if not isinstance(value, int | str):
        raise ValueError("a priority is low, normal, high or a whole number")
    return priorities.parse(value)


# A run's priority: a name or a number in, a number stored. Its schema says a string, so that the command line's flag
# (made from this schema) takes `--priority high` as well as `--priority 50`.
PRIORITY_PATTERN = r"^(low|normal|high|-?[0-9]{1,4})$"
Priority = Annotated[
    int, BeforeValidator(_priority), WithJsonSchema({"type": "string", "pattern": PRIORITY_PATTERN, "maxLength": 6})
]


class RunCreate(TrainerOptions):
    """A new run of a built-in workload, or of your own script; the form shows these limits next to each field. The
    trainer's options (TrainerOptions) become the run's config document; a script's run keeps only its arguments."""

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
    max_restarts: int = Field(
        default=0, ge=0, le=100, description="Restart the workers this often after a rank dies; they resume exactly."
    )
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
    priority: Priority = Field(
        default=priorities.NORMAL, json_schema_extra={"default": "normal"},
        description="Its place in the queue: low, normal, high, or a number from -1000 to 1000; higher starts "
        "first (an operator may give up to the admin's limit).",
    )  # fmt: skip
    preemptible: bool = Field(
        default=True,
        description="A waiting run of higher priority may ask it to stop (it checkpoints) and wait to resume; never "
        "a run of your own script.",
    )

    def config(self) -> dict[str, Any]:
        """The run's config document: a script's arguments for a run of the user's script (the trainer's options
        would only be values it never had), else every trainer option."""
        if self.script:
            # Desync checks reach a script too: as torch's own, TORCH_DISTRIBUTED_DEBUG=DETAIL in its ranks' env.
            return {"script_args": list(self.script_args), "desync_checks": self.desync_checks}
        return self.model_dump(include=set(OPTION_NAMES))

    @classmethod
    def values_of(cls, run: Run) -> dict[str, Any]:
        """What a new run like this one starts from: its own columns, and the options and script arguments of its
        config document; nothing it never had (those keep their defaults), nor a workload the form does not offer
        ("script", "external")."""
        values = {name: getattr(run, name) for name in cls.model_fields if hasattr(run, name)}
        if values.get("workload") not in wire.WORKLOADS:
            values.pop("workload", None)
        return {name: value for name, value in values.items() if value is not None}

    def columns(self) -> dict[str, Any]:
        """What the run keeps as its own columns: what to run, where, and how; not its config document."""
        return self.model_dump(exclude={*OPTION_NAMES, "script_args", "allow_low_disk"})


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


# A run's trainer options, each as the API showed it before the config document (`RunOut.config`): made from
# TrainerOptions, so a new option shows here too; null where the run never had it (a script's run, or one launched
# elsewhere: read its `config`).
if TYPE_CHECKING:
    _TrainerOptionsOut = BaseModel
else:
    _TrainerOptionsOut = create_model(
        "TrainerOptionsOut",
        **{name: (type(field.default) | None, None) for name, field in TrainerOptions.model_fields.items()},
    )


class RunOut(_TrainerOptionsOut):
    """A run as the API shows it: its own facts, its config document, and its trainer options one by one."""

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
    max_restarts: int
    sweep_of: int | None = Field(description="The run whose scaling sweep this run is part of.")
    config: dict[str, Any] | None = Field(
        default=None,
        description="The run's configuration: a built-in run's trainer options, every one; a script's arguments "
        "(script_args); or what a script launched elsewhere reported with report.init(config=...).",
    )
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
    slurm_nice: int | None = Field(default=None, description="The niceness its Slurm job was submitted with.")
    owner: str | None = Field(default=None, description="The user whose limits and fair share the run counts in.")
    priority: int = Field(default=priorities.NORMAL, description="Its place in the queue: higher starts first.")
    preemptible: bool = Field(default=True, description="A higher-priority run may stop it to make room; it resumes.")
    preempted_at: datetime | None = Field(default=None, description="When it was last asked to stop for another.")
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
    """A config document every store keeps as it came: JSON without NaN or infinities (report.init sends them as the
    strings "NaN" and "Infinity"), and without NUL characters, which PostgreSQL's jsonb refuses."""
    try:
        text = json.dumps(config, default=str, allow_nan=False)
    except ValueError:
        raise ValueError('a number that is not finite: send it as the string "NaN" or "Infinity"') from None
    if "\\u0000" in text:
        raise ValueError("a text holds a NUL character")
    if len(text) > wire.MAX_CONFIG_BYTES:
        raise ValueError(f"{len(text)} bytes as JSON; at most {wire.MAX_CONFIG_BYTES}")
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
    total_steps: int | None = Field(
        default=None, ge=0, le=wire.MAX_STEP,
        description="The steps the script will train (report.init(total_steps=...)); null or 0: it declares none.",
    )  # fmt: skip

    @model_validator(mode="after")
    def _rank_in_world(self) -> JoinIn:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        return self


class JoinOut(BaseModel):
    run_id: int
    token: str = Field(description="This process's own token for the run's ingest endpoint.")
    created: bool = Field(description="This process's join made the run; the others joined it.")
