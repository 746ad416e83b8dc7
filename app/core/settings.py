"""The one configuration object, read once at start-up and passed down."""

from __future__ import annotations

import ipaddress
import math
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AnyHttpUrl, BaseModel, Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.core import cpus, priorities

DEFAULT_SHARED_DIR = Path("/mnt/shared")
# A list setting: from the environment, comma-separated (RANKBOARD_ALLOWED_HOSTS=a.example,b.example).
Names = Annotated[list[str], NoDecode]
# What an alert rule may name (app.services.alerts); a straggler needs signals not yet kept.
AlertCondition = Literal[
    "failed", "lost", "not_progressing", "non_finite_loss", "succeeded", "disk_low", "gpu_fault"
]  # fmt: skip
ALERT_CONDITIONS: tuple[AlertCondition, ...] = (
    "failed", "lost", "not_progressing", "non_finite_loss", "succeeded", "disk_low", "gpu_fault"
)  # fmt: skip


class Webhook(BaseModel):
    """Where alerts go: an admin's configuration (the URL may hold a secret, so only its host is ever shown)."""

    url: AnyHttpUrl
    format: Literal["json", "slack"] = Field(default="json", description="A generic JSON body, or Slack's {text}.")
    events: list[AlertCondition] = Field(default_factory=lambda: list(ALERT_CONDITIONS), min_length=1)
    name: str | None = Field(default=None, max_length=100, description="How deliveries name it; default: the host.")

    @property
    def label(self) -> str:
        """The name deliveries are stored under: never the URL, whose path may be a secret."""
        return self.name or self.host

    @property
    def host(self) -> str:
        return self.url.host or ""


# What sites name partitions, accounts and QoS, and nothing a shell reads (as a run's own Slurm options).
SlurmName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class SlurmBand(BaseModel):
    """What the Slurm job of a run at or above a priority is submitted with."""

    qos: SlurmName | None = Field(default=None, description="--qos")
    nice: int | None = Field(default=None, ge=-2147483645, le=2147483645, description="--nice (below 0: Slurm "
                             "allows it only to its operators and admins)")  # fmt: skip


class SlurmOwner(BaseModel):
    """What the Slurm jobs of a user's (or a group's) runs are submitted with."""

    account: SlurmName | None = None
    partition: SlurmName | None = None


class SlurmChoice(BaseModel):
    """The options the mapping gives one run's job; None where it gives none."""

    qos: str | None = None
    nice: int | None = None
    account: str | None = None
    partition: str | None = None


class SlurmMapping(BaseModel):
    """How the queue's priorities and owners map to what Slurm offers. `priority`: by the lowest priority of each
    band (a name or a number); a run gets the band of the highest key at or below its priority. `owners`: by user
    name, or `@group`; a user's own entry first, then their groups' by name. A run's own Slurm options win."""

    priority: dict[str, SlurmBand] = Field(default_factory=dict)
    owners: dict[str, SlurmOwner] = Field(default_factory=dict)

    @field_validator("priority")
    @classmethod
    def _priority_keys(cls, bands: dict[str, SlurmBand]) -> dict[str, SlurmBand]:
        for key in bands:
            priorities.parse(key)  # ValueError naming what a priority may be
        return bands

    def choose(self, *, priority: int, owner: str, groups: list[str]) -> SlurmChoice:
        """The options for a run of this priority whose owner is in these groups."""
        keyed = sorted((priorities.parse(key), band) for key, band in self.priority.items())
        band = next((band for low, band in reversed(keyed) if low <= priority), SlurmBand())
        entries = [self.owners.get(owner), *(self.owners.get(f"@{group}") for group in sorted(groups))]
        account = next((entry.account for entry in entries if entry and entry.account), None)
        partition = next((entry.partition for entry in entries if entry and entry.partition), None)
        return SlurmChoice(qos=band.qos, nice=band.nice, account=account, partition=partition)


class Settings(BaseSettings):
    """Everything the server can be told; each field also reads `RANKBOARD_<NAME>` from the environment."""

    model_config = SettingsConfigDict(env_prefix="RANKBOARD_")

    data_dir: Path = Field(default=Path("data"), description="The SQLite file and the server's own files.")
    shared_dir: Path | None = Field(
        default=None,
        description="Checkpoints, logs and datasets. Default: /mnt/shared where it exists and is writable, "
        "else <data_dir>/shared.",
    )
    scripts_dir: Path | None = Field(
        default=None, description="Besides the shared folder, where runs may find training scripts of their own."
    )
    database_url: str | None = Field(default=None, description="Overrides the SQLite file, e.g. postgresql+psycopg://")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    workers: int = Field(
        default=1, ge=1, le=64,
        description="Server processes on the one port (PostgreSQL only: SQLite takes one writer, so one process); "
        "one of them, the holder of the supervisor's lease, starts and finishes runs and sends alerts.",
    )  # fmt: skip
    public_url: str | None = Field(default=None, description="How trainers reach this server; default from host:port.")
    stop_grace_s: float = Field(default=60.0, gt=0, description="SIGTERM to SIGKILL, when a run is stopped.")
    supervise_interval_s: float = Field(default=0.5, gt=0, description="How often run processes are checked.")
    stall_after_s: float = Field(
        default=60.0, gt=0, description="A running run whose ranks' heartbeats are older than this is not progressing."
    )
    external_lost_after_s: float = Field(
        default=120.0, gt=0, description="A run launched elsewhere that has not posted for this long is lost."
    )
    server_cpus: Annotated[frozenset[int] | None, NoDecode] = Field(
        default=None,
        description="CPUs the server's own threads keep to, as taskset lists them (0-1,6; Linux): on a node that "
        "trains too, cores training does not use. The runs it starts still get every CPU it was started with.",
    )
    ingest_nice: int = Field(
        default=0, ge=0, le=19,
        description="Niceness of the threads that take trainers' batches: on a node that trains too, 19 gives "
        "training the CPU first where its cores are full (Linux; else see server_cpus).",
    )  # fmt: skip
    slots: int | None = Field(
        default=None, ge=1, description="Processes the local launcher may run at once; default: GPUs, else CPU cores."
    )
    launcher: Literal["auto", "local", "slurm"] = Field(
        default="auto", description="Offer Slurm to runs: auto (when sbatch is found), local (never), slurm (always)."
    )
    slurm_partition: str | None = Field(default=None, description="The partition of Slurm runs that name none.")
    slurm_account: str | None = Field(default=None, description="The account of Slurm runs that name none.")
    slurm_time_limit: str = Field(default="01:00:00", description="The time limit of Slurm runs that give none.")
    slurm_agents_per_node: int = Field(
        default=1,
        ge=1,
        le=64,
        description="torchrun agents per Slurm node: 1 on a cluster; more lets one host stand "
        "in for several nodes (tests).",
    )
    slurm_poll_s: float = Field(default=2.0, gt=0, description="How often squeue is asked about live Slurm runs.")
    slurm_mapping: SlurmMapping = Field(
        default_factory=SlurmMapping,
        description='Slurm options from a run\'s priority and owner, as JSON: {"priority": {"low": {"qos": '
        '"scavenger", "nice": 100}, "high": {"qos": "urgent"}}, "owners": {"ada": {"account": "vision"}, "@nlp": '
        '{"partition": "big"}}}; a run\'s own options win.',
    )
    preemption: bool = Field(
        default=True,
        description="A queued run may ask lower-priority runs of the built-in trainer on this host to stop (they "
        "checkpoint) and wait again, to make room for it.",
    )
    preempt_interval_s: float = Field(
        default=600.0, ge=0, description="A run is preempted at most once in this many seconds, so that none thrash."
    )
    fair_share: bool = Field(
        default=False,
        description="Among queued runs of equal priority, the owner whose runs held the fewest GPU-hours (or CPU "
        "slot-hours) within fair_share_window_h goes first.",
    )
    fair_share_window_h: float = Field(default=168.0, gt=0, description="Fair share's window, in hours.")
    operator_priority_max: int = Field(
        default=priorities.NAMES["high"], ge=priorities.LOWEST, le=priorities.HIGHEST,
        description="The highest priority an operator may give a run; an admin may give any.",
    )  # fmt: skip
    allowed_hosts: Names = Field(
        default_factory=list,
        description="Host names this server answers to besides 127.0.0.1, localhost and [::1] (and the bind address, "
        "this machine's name when bound to all addresses, public_url's host); '*' turns the check off.",
    )
    admin_password: SecretStr | None = Field(
        default=None,
        description="At start, with no user yet, an admin named admin_user is made with this password: this turns "
        "authentication on.",
    )
    admin_user: str = Field(default="admin", description="The first-start admin's name (see admin_password).")
    trusted_proxy: Names = Field(
        default_factory=list,
        description="Addresses of an authenticating reverse proxy: only from these is X-Forwarded-User (or "
        "Remote-User) believed. Setting it turns authentication on.",
    )
    proxy_role: Literal["viewer", "operator", "admin"] = Field(
        default="viewer", description="The role of a proxy-named user who is not one of this server's users."
    )
    session_idle_s: float = Field(default=8 * 3600, gt=0, description="A login ends after this long unused.")
    session_max_s: float = Field(default=7 * 24 * 3600, gt=0, description="A login ends this long after it began.")
    login_attempts: int = Field(default=5, ge=1, description="Failed logins allowed per name (and 4x per address)...")
    login_window_s: float = Field(default=300.0, gt=0, description="...within this many seconds; then 429 until then.")
    prometheus: bool = Field(default=False, description="Serve Prometheus metrics at /metrics (viewers may read).")
    alert_webhooks: list[Webhook] = Field(
        default_factory=list,
        description='Alert rules as JSON: [{"url": "https://hooks.slack.com/...", "format": "slack", "events": '
        '["failed", "lost"]}]; events: failed, lost, not_progressing, non_finite_loss, succeeded, disk_low, '
        "gpu_fault (an Xid, a double-bit ECC error, a row remap pending or failed, a hardware slowdown) "
        "(default: all).",
    )
    alert_disk_free_percent: float = Field(
        default=5.0, ge=0, le=100, description="disk_low: the shared folder's free space below this percentage."
    )
    alert_attempts: int = Field(default=5, ge=1, le=20, description="Tries of one alert delivery before it fails.")
    alert_timeout_s: float = Field(default=5.0, gt=0, le=60, description="One webhook call's connect+read limit.")
    alert_backoff_s: float = Field(
        default=1.0, gt=0, le=60, description="The wait before the 2nd try; doubled each try, at most 60 s."
    )
    gpu_prices: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=dict,
        description="Dollars per GPU-hour by GPU model, for what runs cost: H100=2.49/h,A100=1.10/h; a model matches "
        "a GPU whose name holds it (any case), the longest such model first.",
    )
    _shared_fallback: bool = PrivateAttr(default=False)

    @field_validator("allowed_hosts", "trusted_proxy", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value

    @field_validator("gpu_prices", mode="before")
    @classmethod
    def _price_list(cls, value: object) -> object:
        return parse_prices(value) if isinstance(value, str) else value

    @field_validator("gpu_prices")
    @classmethod
    def _prices_positive(cls, prices: dict[str, float]) -> dict[str, float]:
        for model, price in prices.items():
            if not model.strip() or not math.isfinite(price) or price < 0:
                raise ValueError(f"{model}={price}: a price is a GPU model and a number of dollars an hour, 0 or more")
        return prices

    @field_validator("server_cpus", mode="before")
    @classmethod
    def _cpu_list(cls, value: object) -> object:
        if value == "":
            return None
        return cpus.parse(value) if isinstance(value, str) else value

    @field_validator("server_cpus")
    @classmethod
    def _cpus_available(cls, value: frozenset[int] | None) -> frozenset[int] | None:
        if value is not None:
            own = cpus.available()
            if not value:
                raise ValueError("names no CPU")
            if not value <= own:
                missing, have = cpus.describe(value - own), cpus.describe(own)
                raise ValueError(f"CPUs {missing} are not among this server's ({have})")
        return value

    @field_validator("admin_password", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value  # an unset variable passed on as empty (docker-compose)

    @field_validator("data_dir", "shared_dir", "scripts_dir")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        return None if path is None else path.expanduser().resolve()

    @model_validator(mode="after")
    def _choose_shared_dir(self) -> Settings:
        if self.shared_dir is None:
            usable = DEFAULT_SHARED_DIR.is_dir() and os.access(DEFAULT_SHARED_DIR, os.W_OK)
            self.shared_dir = DEFAULT_SHARED_DIR if usable else self.data_dir / "shared"
            self._shared_fallback = not usable
        return self

    @property
    def shared(self) -> Path:
        """The shared storage root: never None once the settings are built."""
        assert self.shared_dir is not None
        return self.shared_dir

    @property
    def shared_dir_is_fallback(self) -> bool:
        """True when /mnt/shared was unusable and a folder under the data directory stands in for it."""
        return self._shared_fallback

    @property
    def script_roots(self) -> list[Path]:
        """The folders a run's script may be in."""
        return [self.shared, *([self.scripts_dir] if self.scripts_dir else [])]

    @property
    def binds_loopback(self) -> bool:
        """True when only this machine can reach the server: bound to a loopback address."""
        return is_loopback(self.host)

    @property
    def on_sqlite(self) -> bool:
        """Whether the database is a SQLite file (the default), which one server process writes."""
        return self.sqlalchemy_url.startswith("sqlite")

    @property
    def sqlalchemy_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'rankboard.db'}"

    @property
    def trainer_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


def parse_prices(text: str) -> dict[str, float]:
    """`H100=2.49/h,A100=1.10/h` as {model: dollars per GPU-hour}; ValueError naming the part that is wrong."""
    prices: dict[str, float] = {}
    for part in (part.strip() for part in text.split(",")):
        if not part:
            continue
        model, equals, price = (piece.strip() for piece in part.partition("="))
        number = price.removesuffix("/h").strip()
        try:
            value = float(number)
        except ValueError:
            value = math.nan
        if not equals or not model or not math.isfinite(value) or value < 0:
            raise ValueError(f"{part!r} is not MODEL=DOLLARS/h (a GPU model, =, a price of 0 or more an hour)")
        if model.casefold() in (known.casefold() for known in prices):
            raise ValueError(f"{part!r}: {model} has a price already")
        prices[model] = value
    return prices


def is_loopback(host: str) -> bool:
    """True for localhost and the loopback addresses (127.0.0.0/8, ::1), bracketed or not."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
