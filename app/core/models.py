"""The stored things: runs, their lifecycle events, their metric series and points; users, their sessions and API
tokens, and the audit trail of who did what.

The schema itself comes only from Alembic migrations (`migrations/`); these classes describe it to SQLAlchemy.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from app.core.trainer_options import OPTION_NAMES, options_of


class RunStatus(str, enum.Enum):
    """Where a run is in its lifecycle: queued -> starting -> running -> stopping -> one of the final four."""

    queued = "queued"
    starting = "starting"
    running = "running"
    stopping = "stopping"
    succeeded = "succeeded"
    failed = "failed"
    stopped = "stopped"
    lost = "lost"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATUSES

    @property
    def has_process(self) -> bool:
        return self in (RunStatus.starting, RunStatus.running, RunStatus.stopping)


FINAL_STATUSES = frozenset({RunStatus.succeeded, RunStatus.failed, RunStatus.stopped, RunStatus.lost})


STATUS_TYPE = Enum(RunStatus, native_enum=False, length=16, validate_strings=True)
# SQLite makes only an INTEGER PRIMARY KEY its rowid; elsewhere points need 64 bits.
POINT_ID_TYPE = BigInteger().with_variant(Integer, "sqlite")
# Steps go past 2**31 (GPU samples are keyed by unix seconds; long runs count tokens): 64 bits everywhere. SQLite's
# INTEGER already is.
STEP_TYPE = BigInteger().with_variant(Integer, "sqlite")


# A run's config document: binary JSON on PostgreSQL, which the runs table reads a key of without parsing the text of
# every run again for every operator (8 times faster there at 10,000 runs; bench/runs_table.py).
CONFIG_TYPE = JSON().with_variant(JSONB(), "postgresql")


class UtcDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every database (SQLite keeps no time zone of its own)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=timezone.utc)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    status: Mapped[RunStatus] = mapped_column(STATUS_TYPE, index=True)
    status_reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    # What to run: a built-in workload, "script" (the user's own) or "external" (launched elsewhere), on how many
    # processes per node, restarted how often; the rest of what it runs with is its config document.
    workload: Mapped[str] = mapped_column(String(50))
    nproc_per_node: Mapped[int] = mapped_column(Integer)
    max_restarts: Mapped[int] = mapped_column(Integer, default=0)
    sweep_of: Mapped[int | None] = mapped_column(Integer, index=True)  # the run whose scaling sweep this run is part of
    nccl_env: Mapped[dict[str, str] | None] = mapped_column(JSON)
    # A run of the user's own script: a path relative to an allowed root; workload is "script".
    script: Mapped[str | None] = mapped_column(String(1000))
    # The run's configuration, one JSON document: a built-in run's trainer options, every one of them, as
    # app.core.trainer_options.TrainerOptions checked them; a script's arguments ({"script_args": [...]}); or, for a run
    # launched elsewhere, what its script reported (report.init(config=...)). A new option needs no column.
    config: Mapped[dict[str, Any] | None] = mapped_column(CONFIG_TYPE)
    # Where it runs: "local" (this host) or "slurm" (a batch job, with these options; None: the server's default).
    launcher: Mapped[str] = mapped_column(String(16), default="local")
    slurm_nodes: Mapped[int] = mapped_column(Integer, default=1)
    slurm_gpus_per_node: Mapped[int] = mapped_column(Integer, default=0)
    slurm_cpus_per_task: Mapped[int] = mapped_column(Integer, default=1)
    slurm_time_limit: Mapped[str | None] = mapped_column(String(32))
    slurm_partition: Mapped[str | None] = mapped_column(String(64))
    slurm_account: Mapped[str | None] = mapped_column(String(64))
    slurm_qos: Mapped[str | None] = mapped_column(String(64))
    slurm_constraint: Mapped[str | None] = mapped_column(String(200))
    slurm_requeue: Mapped[bool] = mapped_column(default=False)
    slurm_max_requeues: Mapped[int] = mapped_column(Integer, default=1)
    slurm_nice: Mapped[int | None] = mapped_column(Integer)  # as the server's mapping of its priority gave it

    # The queue of this host's slots (app.services.scheduling): whom the run counts against (a user's name, not the
    # actor's words: "ada (token ci)" is ada), and how it goes before others, higher first (app.core.priorities).
    # `preemptible`: a higher-priority run may ask it to stop, checkpoint and wait again. `preempted_by` is set while
    # such a stop is under way (its end requeues the run rather than ends it); `preempted_at` keeps when it last was,
    # so that it is not preempted again within the server's interval.
    owner: Mapped[str | None] = mapped_column(String(200), index=True)  # fair share sums an owner's runs
    priority: Mapped[int] = mapped_column(Integer, default=0)
    preemptible: Mapped[bool] = mapped_column(default=True)
    preempted_by: Mapped[int | None] = mapped_column(Integer)
    preempted_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    # A run launched elsewhere (launcher "external"): the job's key that every rank joins by, how many ranks its job
    # has, when any of them last posted, and whether its script takes a stop.
    external_key: Mapped[str | None] = mapped_column(String(200), unique=True, index=True)
    world_size: Mapped[int | None] = mapped_column(Integer)
    contact_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    takes_stop: Mapped[bool] = mapped_column(default=False)
    checkpoint_folder: Mapped[str | None] = mapped_column(String(1000))  # where its script saves, in the shared folder

    created_by: Mapped[str | None] = mapped_column(String(200))  # who asked for it (an Actor's name); None: before 0009
    # The trainer proves who it is with a token made for each launch; only its hash is kept.
    token_hash: Mapped[str | None] = mapped_column(String(64))

    # The process, as the launcher started it: enough for a restarted server to find it or declare it lost.
    launch_id: Mapped[str | None] = mapped_column(String(32))
    pid: Mapped[int | None] = mapped_column(Integer)
    pid_start_ticks: Mapped[int | None] = mapped_column(STEP_TYPE)  # clock ticks since boot: past 2**31 in 248 days
    command: Mapped[list[str] | None] = mapped_column(JSON)
    devices: Mapped[list[int] | None] = mapped_column(JSON)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    stop_requested_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # A Slurm run's job, as the latest squeue described it: state, why it waits, the nodes it holds.
    job_id: Mapped[str | None] = mapped_column(String(32))
    job_state: Mapped[str | None] = mapped_column(String(32))
    job_reason: Mapped[str | None] = mapped_column(String(200))
    node_list: Mapped[str | None] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # 1 once launched; a Slurm requeue makes it 2, 3...

    # The trainer's last report of where it stands; `heartbeat_at` is when it came.
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    step: Mapped[int] = mapped_column(STEP_TYPE, default=0)
    total_steps: Mapped[int] = mapped_column(STEP_TYPE, default=0)
    samples_per_s: Mapped[float] = mapped_column(Float, default=0.0)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    trainer_finished: Mapped[bool] = mapped_column(default=False)
    final_loss: Mapped[float | None] = mapped_column(Float)
    restarts: Mapped[int] = mapped_column(Integer, default=0)  # torchrun restarts of the workers seen so far
    # The newest "dump every rank" request (app/services/forensics.py): its number, counted per run, and when; the
    # ingest reply names it to the ranks while it is fresh.
    dump_request: Mapped[int | None] = mapped_column(Integer)
    dump_requested_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # Each node's inventory as its GPU sampler reported it (wire.Node), one per host, replaced when it reports again:
    # [{"host": "node-1", "gpus": [{"index": 0, "uuid": "GPU-...", "name": "..."}], "nvml_error": None}, ...].
    gpus: Mapped[list[dict[str, object]] | None] = mapped_column(JSON)
    # The runs table's own (0011): the user's notes; archived runs leave the default list; a run being deleted has
    # `deleting_at` set in the first of the deletion's transactions and is shown nowhere from then on.
    notes: Mapped[str] = mapped_column(Text, default="")
    archived_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    deleting_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    tag_rows: Mapped[list[RunTag]] = relationship(order_by="RunTag.tag", cascade="all, delete-orphan",
                                                  passive_deletes=True)  # fmt: skip

    events: Mapped[list[RunEvent]] = relationship(
        back_populates="run", order_by="RunEvent.id", cascade="all, delete-orphan", passive_deletes=True
    )
    audit: Mapped[list[AuditEntry]] = relationship(order_by="AuditEntry.id", viewonly=True)

    if TYPE_CHECKING:
        # A key of the config document read as an attribute (`run.lr`, `run.script_args`): see ConfigKey.
        def __getattr__(self, name: str) -> Any: ...

    @property
    def tags(self) -> list[str]:
        return [row.tag for row in self.tag_rows]

    def trainer_options(self) -> dict[str, Any]:
        """The built-in trainer's options in the config document, as stored; none for a run launched elsewhere, whose
        document is its script's own (a key that shares an option's name is not the trainer's option)."""
        return {} if self.external_key is not None else options_of(self.config)

    @property
    def folder(self) -> str:
        """The run's folder name under `<shared>/checkpoints/` and `<shared>/logs/`."""
        return f"run-{self.id}"


class ConfigKey:
    """One key of a run's config document as an attribute of the run, read and written: `run.lr`, and `Run(lr=...)`
    where a run is made by hand. Reading gives None (or `missing`) where the document lacks it, and for a run launched
    elsewhere, whose document is what its script reported rather than the trainer's options."""

    def __init__(self, name: str, missing: Callable[[], Any] = lambda: None) -> None:
        self.name, self.missing = name, missing

    def __get__(self, run: Run | None, owner: type[Run]) -> Any:
        if run is None:
            return self
        if run.external_key is not None:
            return None
        return (run.config or {}).get(self.name, self.missing())

    def __set__(self, run: Run, value: Any) -> None:
        run.config = {**(run.config or {}), self.name: value}  # a new dict: the ORM sees the change


for _key in (*(ConfigKey(name) for name in OPTION_NAMES), ConfigKey("script_args", missing=list)):
    setattr(Run, _key.name, _key)


class RunEvent(Base):
    """One lifecycle transition, with a reason a person can read."""

    __tablename__ = "run_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    status: Mapped[RunStatus] = mapped_column(STATUS_TYPE)
    reason: Mapped[str] = mapped_column(Text)

    run: Mapped[Run] = relationship(back_populates="events")


class MetricSeries(Base):
    """One metric key of one run; its points live in `metric_chunks`."""

    __tablename__ = "metric_series"
    __table_args__ = (UniqueConstraint("run_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))


class MetricChunk(Base):
    """One rank's points of one series with steps in [chunk * SPAN, (chunk + 1) * SPAN), packed (app.store.chunks).

    Clustered on its key (WITHOUT ROWID on SQLite), the only index: a series' chunks are one contiguous range, by
    step, every rank's of a step range together. `first_time`, the earliest time in the chunk, finds where a run
    stood at a moment without unpacking every chunk.
    """

    __tablename__ = "metric_chunks"
    __table_args__ = ({"sqlite_with_rowid": False},)

    series_id: Mapped[int] = mapped_column(
        ForeignKey("metric_series.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    chunk: Mapped[int] = mapped_column(STEP_TYPE, primary_key=True, autoincrement=False)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    n: Mapped[int] = mapped_column(Integer)
    first_time: Mapped[float] = mapped_column(Float)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RecentPoints(Base):
    """The newest points as they were stored, for live pages: one row per run per ingest transaction, with the points
    it added to each (series, rank) of the run (app.store.metrics.log_recent). `id` numbers points, not rows: it is
    the row's last point's number, so a cursor is a point number, as with a point table. Only the newest
    `app.store.metrics.RECENT_POINTS` are kept."""

    __tablename__ = "metric_recent"
    __table_args__ = (Index("ix_metric_recent_run_id_id", "run_id", "id"),)

    id: Mapped[int] = mapped_column(POINT_ID_TYPE, primary_key=True, autoincrement=False)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    n: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RecentHead(Base):
    """The number of the newest point ever logged in `metric_recent`: the next batch numbers on from it. Kept apart
    from the log's rows, which go with their run when it is deleted: numbering on from the newest row left would
    give a point a number that a live page's cursor has already passed, and the page would never show it."""

    __tablename__ = "metric_recent_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)  # always 1: one row
    head: Mapped[int] = mapped_column(POINT_ID_TYPE)


class RunRank(Base):
    """One rank's own heartbeat: the step it last reported, from which host, and when."""

    __tablename__ = "run_ranks"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    host: Mapped[str] = mapped_column(String(255))
    step: Mapped[int] = mapped_column(STEP_TYPE)
    heartbeat_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # An external run's rank says how its process ended: "finished" (report.finished()), "exited", "failed".
    ended: Mapped[str | None] = mapped_column(String(16))


class RunToken(Base):
    """A token one process of an external run got when it joined; only its SHA-256 is kept. (A launched run's one
    token is `Run.token_hash`.)"""

    __tablename__ = "run_tokens"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class MetricTier(Base):
    """A series pre-aggregated per `tier` steps, so a zoomed-out chart reads a few rows per pixel, not every point.

    One row per (series, tier, bucket, rank): bucket is step // tier; `min_value` and `max_value` ignore NaN (NULL
    when the bucket holds only NaN); `last_step` is the bucket's highest step, `last_value` the value there (NULL
    for NaN) and `last_time` its unix time (nullable only because 0018 added it to a filled table, then filled it).
    Kept up to date on ingest (app.store.charts.merge_tiers): the finest tier's buckets with each point, a coarser
    tier's once the series' steps pass their end. On SQLite it is stored WITHOUT ROWID: the rows are the primary-key
    index, so a range of buckets is one contiguous read.
    """

    __tablename__ = "metric_tiers"
    __table_args__ = ({"sqlite_with_rowid": False},)

    series_id: Mapped[int] = mapped_column(
        ForeignKey("metric_series.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    tier: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    bucket: Mapped[int] = mapped_column(STEP_TYPE, primary_key=True, autoincrement=False)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    min_value: Mapped[float | None] = mapped_column(Float)
    max_value: Mapped[float | None] = mapped_column(Float)
    last_step: Mapped[int] = mapped_column(STEP_TYPE)
    last_value: Mapped[float | None] = mapped_column(Float)
    last_time: Mapped[float | None] = mapped_column(Float)


class RunTag(Base):
    """One tag on one run."""

    __tablename__ = "run_tags"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)


class MetricSummary(Base):
    """A series' last value (at its highest step, lowest rank there), min and max over all ranks (ignoring NaN), kept
    on ingest so the runs table sorts and filters 10,000 runs by a metric without reading their points."""

    __tablename__ = "metric_summaries"
    __table_args__ = (
        Index("ix_metric_summaries_key_run", "key", "run_id", unique=True),
        Index("ix_metric_summaries_run_id", "run_id"),
    )

    series_id: Mapped[int] = mapped_column(
        ForeignKey("metric_series.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))
    last_step: Mapped[int] = mapped_column(STEP_TYPE)
    last_value: Mapped[float | None] = mapped_column(Float)
    min_value: Mapped[float | None] = mapped_column(Float)
    max_value: Mapped[float | None] = mapped_column(Float)


class Role(str, enum.Enum):
    """What a user may do: a viewer reads everything; an operator also starts, stops, resumes and deletes; an admin
    also manages users and tokens. Ordered: each role may do all that the ones before it may."""

    viewer = "viewer"
    operator = "operator"
    admin = "admin"

    def allows(self, needed: Role) -> bool:
        return ROLE_ORDER.index(self) >= ROLE_ORDER.index(needed)


ROLE_ORDER = (Role.viewer, Role.operator, Role.admin)
ROLE_TYPE = Enum(Role, native_enum=False, length=16, validate_strings=True)


class User(Base):
    """A person who logs in; `password_hash` is scrypt's, with its parameters and salt (app.auth.passwords)."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[Role] = mapped_column(ROLE_TYPE)
    password_hash: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class UserLimit(Base):
    """At most how many of this host's slots (GPUs, or CPU process slots) and runs one user holds at once; the user
    named `*` stands for every user without a limit of their own. None: no such limit."""

    __tablename__ = "user_limits"

    user_name: Mapped[str] = mapped_column(String(64), primary_key=True)
    max_slots: Mapped[int | None] = mapped_column(Integer)
    max_runs: Mapped[int | None] = mapped_column(Integer)


class UserGroup(Base):
    """Users who share one limit on this host's slots and runs, all of theirs counted together. Members are named,
    not linked: a user a proxy names need not be one of this server's users."""

    __tablename__ = "user_groups"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    max_slots: Mapped[int | None] = mapped_column(Integer)
    max_runs: Mapped[int | None] = mapped_column(Integer)

    members: Mapped[list[GroupMember]] = relationship(
        order_by="GroupMember.user_name", cascade="all, delete-orphan", passive_deletes=True, lazy="selectin"
    )

    @property
    def member_names(self) -> list[str]:
        return [member.user_name for member in self.members]


class GroupMember(Base):
    __tablename__ = "group_members"

    group_id: Mapped[int] = mapped_column(ForeignKey("user_groups.id", ondelete="CASCADE"), primary_key=True)
    user_name: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)


class LoginSession(Base):
    """A browser's login: the cookie holds a random id, this table only its SHA-256."""

    __tablename__ = "login_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)

    user: Mapped[User] = relationship(lazy="joined")


class LoginFailure(Base):
    """A failed login, once per key it counts against (the SHA-256 of `user:<name>`, of `addr:<client>`): in the
    database, so that every worker of `serve --workers N` counts the same (app.services.login_throttle)."""

    __tablename__ = "login_failures"
    __table_args__ = (Index("ix_login_failures_key_at", "key", "at"), Index("ix_login_failures_at", "at"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(UtcDateTime)


class ApiToken(Base):
    """A bearer token for automation; only its SHA-256 is kept. `user_id` is who made it (None: made from the CLI)."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[Role] = mapped_column(ROLE_TYPE)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    user: Mapped[User | None] = relationship(lazy="joined")


class AuditEntry(Base):
    """Who did what, and when: a run created, stopped, resumed, its checkpoints deleted; users and tokens managed."""

    __tablename__ = "audit_entries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(32))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    detail: Mapped[str] = mapped_column(Text, default="")


class Alert(Base):
    """One episode of an alert condition: raised once, cleared when the condition no longer holds (de-duplication:
    no second alert of the same condition for the same run while one is open). `run_id` None: the server's own
    (the shared folder's disk)."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    condition: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    raised_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    cleared_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class AlertDelivery(Base):
    """One alert sent to one webhook: `webhook` is the rule's label (never its URL, which may hold a secret);
    `status` pending until sent, or failed after its last attempt."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (Index("ix_alert_deliveries_status", "status", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    condition: Mapped[str] = mapped_column(String(32))
    webhook: Mapped[str] = mapped_column(String(200))
    url_host: Mapped[str] = mapped_column(String(255))
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str] = mapped_column(Text, default="")
    http_status: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    next_attempt_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class Lease(Base):
    """A job that exactly one server process may do at a time (`supervisor`): `holder` does it until `expires_at`,
    renewing it as it goes; another process may take it once it is released (holder None) or has expired."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(200))
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)


class IngestTotal(Base):
    """What every server process has taken, together (`all`): each process adds what it took since it last did, so
    /metrics counts them all, whichever worker a scrape reaches."""

    __tablename__ = "ingest_totals"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    batches: Mapped[int] = mapped_column(BigInteger, default=0)
    accepted: Mapped[int] = mapped_column(BigInteger, default=0)
    stored: Mapped[int] = mapped_column(BigInteger, default=0)


class LaunchCost(Base):
    """What one launch of a settled run held and drew (app.services.usage), measured once from its goodput ledger and
    its GPUs' samples, so that a usage report reads these rows instead of every run's samples. A row holds while
    `run_ended_at` is its run's `finished_at`: a run resumed since ends again later, and is measured again. A run
    that never launched has one row with no launch, so that it is known measured."""

    __tablename__ = "run_costs"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)  # 0, 1...: launch order
    run_ended_at: Mapped[datetime] = mapped_column(UtcDateTime)
    launched: Mapped[float | None] = mapped_column(Float)  # unix seconds, as app.services.cost.Window has them
    ended: Mapped[float | None] = mapped_column(Float)
    device: Mapped[str] = mapped_column(String(3))  # gpu | cpu
    devices: Mapped[int] = mapped_column(Integer)  # GPUs held, or processes on CPUs
    device_hours: Mapped[float] = mapped_column(Float)
    kwh: Mapped[float | None] = mapped_column(Float)  # None where no GPU energy was sampled
    energy_method: Mapped[str] = mapped_column(String(32))  # the run's, over all its launches
    # {model: GPUs} as NVML names them: the price is the admin's of the day, applied when a report reads the row.
    gpu_models: Mapped[dict[str, int]] = mapped_column(JSON)
    goodput: Mapped[float | None] = mapped_column(Float)  # the run's training share of its device-hours, if itemized
