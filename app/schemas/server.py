"""This server: is it up, and with what."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ServerOut(BaseModel):
    status: str
    shared_dir: str
    shared_dir_is_fallback: bool
    launcher: str = Field(description="Where a run goes when it names no launcher: always this host's.")
    launchers: list[str] = Field(description="Where runs can go: local, and slurm when this server can submit.")
    process_slots: int
    gpus: int
