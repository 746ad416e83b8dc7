"""What every integration does with its job's ranks: one key for all of them, each joining the run with it, and one
decision to stop that every rank takes at the same step.

A library's own launcher (Lightning's, which starts ranks 1.. as copies of the script) leaves no variable that all
ranks share, as torchrun's rendezvous id or Slurm's job id are: rank 0's own key (rankboard.external) is then given
to the others over the process group, at a moment when every rank calls in.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .. import external, report, wire
from ..importers import fitting_config


def world() -> tuple[int, int]:
    """This process's rank and the number of ranks: the process group's, else the environment's."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def agreed_key() -> str:
    """The job's key, the same on every rank: the environment's (RANKBOARD_RUN_KEY, Slurm, torchrun), or rank 0's
    given to the others. A collective where the process group is up: every rank must call it at the same point."""
    key = external.job_key()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        holder = [key]
        dist.broadcast_object_list(holder, src=0)
        key = holder[0]
    return key


def join(
    *,
    name: str | None,
    config: Mapping[str, Any],
    key: str | None = None,
    server: str | None = None,
    token: str | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    local_world_size: int | None = None,
) -> None:
    """This rank joins the job's run (report.init), saying it takes a stop; `key` None agrees on one (a collective
    where the process group is up). A no-op in a run that Rankboard launched, whose environment says it all."""
    rank, size = world()
    # report.init reads the rank and the world from the environment, which a library's own launcher may not set.
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(size))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(local_world_size or size))
    key = key or os.environ.get(wire.ENV_RUN_KEY) or agreed_key()
    report.init(server, name, plain_config(config), token=token, key=key, takes_stop=True,
                checkpoint_dir=checkpoint_dir)  # fmt: skip


def plain_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config as JSON holds it: what is no JSON value (a class, a path, a dtype) as its text; past the server's
    64 KB, the keys that fit, with a line on stderr."""
    left_out: Counter[str] = Counter()
    plain = fitting_config(json.loads(json.dumps(dict(config), default=str)), left_out)
    if left_out:
        print(f"rankboard: the config is over {wire.MAX_CONFIG_BYTES:,} bytes as JSON; {left_out.total()} of its keys "
              "are left out", file=sys.stderr)  # fmt: skip
    return plain


def agreed_stop(device: torch.device | None = None) -> bool:
    """Whether the dashboard asked this run to stop, as any rank heard it: each rank's reporter hears it on its own
    post's reply, at its own moment, so the ranks agree over the process group (a collective: every rank calls it
    at the same step), or they would stop at different steps and the others wait in their next all-reduce."""
    asked = report.stop_requested()
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return asked
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    flag = torch.tensor([1 if asked else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def write_sidecar(checkpoint: Path, *, step: int, epoch: int, metrics: Mapping[str, float]) -> None:
    """The sidecar the dashboard lists a checkpoint by (wire.CheckpointSidecar: its step, epoch, loss, size), beside
    it and whole or not at all, as the built-in trainer writes one; `metrics` may hold wire.CHECKPOINT_METRICS."""
    sidecar = wire.CheckpointSidecar(
        file=checkpoint.name, step=step, epoch=epoch, size=checkpoint.stat().st_size, written_at=time.time(),
        metrics={key: float(metrics[key]) for key in wire.CHECKPOINT_METRICS if key in metrics}, reason="step",
    )  # fmt: skip
    target = checkpoint.with_name(wire.sidecar_name(checkpoint.name))
    with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=f".{target.name}.", delete=False) as file:
        json.dump(sidecar.to_json(), file)
    os.replace(file.name, target)
