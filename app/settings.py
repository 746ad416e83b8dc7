"""The one configuration object, read once at start-up and passed down."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SHARED_DIR = Path("/mnt/shared")


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
    public_url: str | None = Field(default=None, description="How trainers reach this server; default from host:port.")
    stop_grace_s: float = Field(default=60.0, gt=0, description="SIGTERM to SIGKILL, when a run is stopped.")
    supervise_interval_s: float = Field(default=0.5, gt=0, description="How often run processes are checked.")
    stall_after_s: float = Field(
        default=60.0, gt=0, description="A running run whose ranks' heartbeats are older than this is not progressing."
    )
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
    _shared_fallback: bool = PrivateAttr(default=False)

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
    def sqlalchemy_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'rankboard.db'}"

    @property
    def trainer_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"
