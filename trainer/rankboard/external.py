"""A run launched elsewhere joins the server: which job this process belongs to, and the join request itself.

Every process of one job must name the same key, with nothing but its own environment to go on, and a restarted
process (torchrun's restarts, a Slurm requeue) the same key again, so that it rejoins its run:
- the user's own (`report.init(key=...)` or RANKBOARD_RUN_KEY), first;
- the Slurm job (its cluster and job id: a requeued job keeps its id);
- torchrun's rendezvous id (`--rdzv-id`, which multi-node jobs and Kubernetes' PyTorchJob set; `--standalone` makes
  a fresh one), unless it is torchrun's default "none";
- else the torchrun agent that started this process (one node's ranks share it: a single-node torchrun) or, with no
  torchrun at all, this process; each by host, pid and start time, which no later process shares.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import wire


def job_key(environ: Mapping[str, str] = os.environ) -> str:
    """The key all processes of this process's job share; see the module's docstring."""
    if environ.get(wire.ENV_RUN_KEY):
        return environ[wire.ENV_RUN_KEY]
    if environ.get("SLURM_JOB_ID"):
        return f"slurm:{environ.get('SLURM_CLUSTER_NAME', 'cluster')}:{environ['SLURM_JOB_ID']}"
    rendezvous = environ.get("TORCHELASTIC_RUN_ID", "none")
    if rendezvous != "none":
        return f"torchrun:{rendezvous}"
    host = socket.gethostname()
    if "TORCHELASTIC_RUN_ID" in environ:  # a worker of torchrun: its parent is the node's agent
        return f"torchrun-agent:{host}:{_process_id(os.getppid())}"
    return f"process:{host}:{_process_id(os.getpid())}"


def _process_id(pid: int) -> str:
    """A pid with its start time (clock ticks since boot): unlike the pid alone, never reused by a later process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return f"{pid}:{stat.rpartition(')')[2].split()[19]}"
    except (OSError, IndexError):  # not Linux: the pid alone
        return str(pid)


def join_request(
    environ: Mapping[str, str],
    *,
    key: str | None,
    name: str,
    config: Mapping[str, Any],
    takes_stop: bool,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    total_steps: int | None = None,
) -> wire.Join:
    """What this process says when it joins: its job's key, its rank among the job's, and its node."""
    return wire.Join(
        key=(key or job_key(environ))[:200],
        name=name[:100] or "external",
        config=dict(config),
        rank=int(environ.get("RANK", "0")),
        world_size=int(environ.get("WORLD_SIZE", "1")),
        local_world_size=int(environ.get("LOCAL_WORLD_SIZE", "1")),
        host=wire.node_name(environ, socket.gethostname()),
        takes_stop=takes_stop,
        checkpoint_dir=os.path.abspath(checkpoint_dir) if checkpoint_dir else None,
        total_steps=total_steps,
    )


@dataclass(frozen=True)
class Joined:
    run_id: str
    token: str
    created: bool = False  # this join made the run: nothing was sent to it before


def join(url: str, api_token: str, request: wire.Join, timeout: float = 5.0) -> tuple[int | None, Joined | None, str]:
    """POSTs the join; returns the HTTP status (None: no answer), the run joined (on success), and a line saying what
    came back. Raises nothing that a network or a server can cause."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    headers = {"Content-Type": "application/json"}
    if api_token:
        headers["Authorization"] = f"Bearer {api_token}"
    connection = kind(parts.hostname or "", parts.port, timeout=timeout)
    try:
        body = json.dumps(request.to_json(), default=str).encode()
        connection.request("POST", parts.path.rstrip("/") + wire.JOIN_PATH, body=body, headers=headers)
        response = connection.getresponse()
        text = response.read()
    except (OSError, http.client.HTTPException) as error:
        return None, None, f"{type(error).__name__}: {error}"
    finally:
        connection.close()
    detail = f"HTTP {response.status}: {text[:300].decode(errors='replace')}"
    if response.status != 200:
        return response.status, None, detail
    try:
        reply = json.loads(text)
        joined = Joined(str(int(reply["run_id"])), str(reply["token"]), reply.get("created") is True)
        return response.status, joined, detail
    except (ValueError, KeyError, TypeError):
        return None, None, f"not a join reply: {detail}"
