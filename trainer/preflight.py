"""Before the first step: do the ranks run the same software on the same kind of hardware, and does the all-reduce
move data at the speed the others see? Minutes here save hours of a run that was never going to work.

Every rank all-gathers its environment fingerprint (Python, torch, CUDA, NCCL, driver, GPU model) and times a short
all-reduce; every rank then holds the same result, so in "refuse" mode they all stop together, with no further
collective. Rank 0 leaves the result in the run folder (`wire.PREFLIGHT_FILE`) for the dashboard.

`RANKBOARD_PREFLIGHT_OVERRIDE="1:torch=2.0.0;1:gpu=NVIDIA A100"` makes rank 1 claim those values: for trying the
check (and testing it) without two differently built machines.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from rankboard import wire

from trainer.checkpoints import write_atomically

ENV_OVERRIDE = "RANKBOARD_PREFLIGHT_OVERRIDE"
SLOW_FRACTION = 0.5  # a rank whose bus bandwidth is below this share of the others' median is named
ITERATIONS = 5


def fingerprint(device: torch.device, rank: int, environ: Mapping[str, str]) -> dict[str, str]:
    """What must match across ranks, as strings; with this rank's overrides from RANKBOARD_PREFLIGHT_OVERRIDE."""
    cuda = device.type == "cuda"
    found = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else "none",
        "driver": _driver_version(),
        "gpu": torch.cuda.get_device_name(device) if cuda else "none",
    }
    for entry in filter(None, environ.get(ENV_OVERRIDE, "").split(";")):
        who, _, assignment = entry.partition(":")
        field, _, value = assignment.partition("=")
        if who.strip() == str(rank) and field.strip() in found:
            found[field.strip()] = value.strip()
    return found


def _driver_version() -> str:
    try:
        # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ..."
        words = Path("/proc/driver/nvidia/version").read_text().split("Kernel Module")[1].split()
    except (OSError, IndexError):
        return "none"
    return words[0] if words else "none"


def bus_bandwidth(device: torch.device, world_size: int) -> tuple[float | None, int]:
    """This rank's all-reduce bus bandwidth in GB/s (nccl-tests' busbw: bytes x 2(n-1)/n over the median time of
    ITERATIONS after a warm-up), and the bytes reduced; None with one rank, which sends nothing."""
    size = (64 if device.type == "cuda" else 4) * 2**20
    if world_size < 2:
        return None, size
    tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
    times = []
    for index in range(ITERATIONS + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index:  # the first one sets up the connections
            times.append(time.perf_counter() - started)
    return size * 2 * (world_size - 1) / world_size / statistics.median(times) / 1e9, size


def check(device: torch.device, rank: int, world_size: int, environ: Mapping[str, str]) -> wire.Preflight:
    """Gather every rank's fingerprint and bandwidth; the same result on every rank."""
    started = time.perf_counter()
    mine = fingerprint(device, rank, environ)
    bandwidth, size = bus_bandwidth(device, world_size)
    everyone: list[tuple[dict[str, str], float | None] | None] = [None] * world_size
    dist.all_gather_object(everyone, (mine, bandwidth))
    prints = [entry[0] if entry else {} for entry in everyone]
    speeds = [entry[1] if entry else None for entry in everyone]
    return wire.Preflight(
        fingerprints=prints, bus_gbps=speeds, bytes=size, mismatches=mismatches(prints), slow_ranks=slow_ranks(speeds),
        seconds=time.perf_counter() - started, at=time.time(),
    )  # fmt: skip


def mismatches(prints: list[dict[str, str]]) -> list[wire.Mismatch]:
    """Each rank whose value of a field differs from the most common one, with that value and the common one."""
    found = []
    for field in prints[0] if prints else {}:
        values = [p.get(field, "") for p in prints]
        common = max(set(values), key=lambda v: (values.count(v), v == values[0]))
        found += [wire.Mismatch(field, rank, value, common) for rank, value in enumerate(values) if value != common]
    return found


def slow_ranks(speeds: list[float | None]) -> list[int]:
    """Ranks whose bandwidth is under SLOW_FRACTION of the median of the others'."""
    slow = []
    for rank, speed in enumerate(speeds):
        others = [s for r, s in enumerate(speeds) if r != rank and s is not None]
        if speed is not None and others and speed < SLOW_FRACTION * statistics.median(others):
            slow.append(rank)
    return slow


def keep(result: wire.Preflight, run_dir: Path | None) -> None:
    """Rank 0 leaves the result in the run folder for the dashboard; a failure to write it stops nothing."""
    if run_dir is None:
        return
    try:
        body = json.dumps(result.to_json()).encode()
        write_atomically(run_dir / wire.PREFLIGHT_FILE, lambda file: file.write(body))
    except OSError as error:
        print(f"[rank 0] could not keep the preflight result in {run_dir}: {error}", flush=True)
