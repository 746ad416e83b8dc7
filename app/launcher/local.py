"""The local launcher: one `torchrun --standalone` per run on this host, never through a shell."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

from rankboard import gpu, wire

from app.core import cpus
from app.core.errors import FieldInvalid
from app.core.folders import RunFolders
from app.core.models import Run, RunStatus
from app.core.settings import Settings
from app.launcher import processes, program
from app.launcher.interface import JobView, Launch, Requeue
from app.schemas.runs import RunCreate

EXIT_FILE = "exit.json"
LAUNCHER_LOG = "launcher.log"  # torchrun's own output; the ranks' goes to ranks/
LAUNCHER_LOG_READ = 4 * 1024 * 1024  # torchrun's agent says little: its failures are in the end of the file
# What torchrun's agent logs when a worker dies: "failed (exitcode: -9) local_rank: 1 (pid: 15366) of binary: ..."
WORKER_FAILURE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
LAUNCH_MARKER = "--- rankboard launch "  # begins the line written to launcher.log before each launch of a run
# Queued too: a Slurm job may start, and its trainer post, before the server sees it leave Slurm's queue.
TAKES_BATCHES = (RunStatus.queued, RunStatus.starting, RunStatus.running, RunStatus.stopping)


def visible_gpus(environ: Mapping[str, str] = os.environ) -> list[int]:
    """NVML indices of this host's GPUs that the server may hand out: those its own CUDA_VISIBLE_DEVICES names (all
    when unset; none when empty), through the same interface the samplers use; none without a driver."""
    try:
        nvml = gpu.open_nvml(environ)
    except gpu.NvmlUnavailable:
        return []
    try:
        return gpu.visible_indices(nvml, environ.get("CUDA_VISIBLE_DEVICES"))
    except nvml.NVMLError:
        return []
    finally:
        nvml.nvmlShutdown()


class LocalLauncher:
    """Starts, signals and inspects the runs of this host."""

    name = "local"
    joins = False
    kills = True
    host_slots = True
    scheduler = ""
    waits_for = "free process slots"
    stop_words = "finishing the step, saving"

    @staticmethod
    def ranks(run: Run) -> int:
        return run.world_size or run.nproc_per_node

    @staticmethod
    def output_file(run: Run, folders: RunFolders) -> Path | None:
        return folders.run_dir(run) / LAUNCHER_LOG

    @staticmethod
    def output_label(run: Run) -> str:
        return "launcher (torchrun)"

    @staticmethod
    def job_script(run: Run, folders: RunFolders) -> Path | None:
        return None  # torchrun's command line says it all (Run.command)

    @staticmethod
    def takes_batch(run: Run, *, now: datetime) -> bool:
        return run.status in TAKES_BATCHES

    @staticmethod
    def stop_refusal(run: Run) -> str | None:
        return None

    @staticmethod
    def resume_refusal(run: Run) -> str | None:
        return None

    @staticmethod
    def rerun_refusal(run: Run) -> str | None:
        return None

    @staticmethod
    def sweep_refusal(run: Run) -> str | None:
        return None

    def __init__(self, settings: Settings, folders: RunFolders) -> None:
        self.settings = settings
        self.folders = folders
        self.gpus = visible_gpus()
        wanted = settings.slots or len(self.gpus) or os.cpu_count() or 1
        # What a run's `devices` hold: GPUs by their NVML index (as the Host page and the samplers name them), one
        # process each; on a host without GPUs, process slots numbered from 0.
        self.slots = self.gpus[:wanted] if self.gpus else list(range(wanted))
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # Where the server keeps to some CPUs (app.core.cpus), the runs get back every one it was started with.
        self.run_cpus = cpus.available() if settings.server_cpus else None

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def capacity(self) -> int:
        """Processes that may run at once."""
        return len(self.slots)

    def trainer_command(self, run: Run) -> list[str]:
        """The torchrun command line of a run, as a list: no shell ever sees it."""
        torchrun = [
            sys.executable, "-m", "torch.distributed.run",
            "--standalone", f"--nproc-per-node={run.nproc_per_node}",
            "--log-dir", str(self.folders.run_dir(run) / "ranks"), "--redirects", "3",
            "--max-restarts", str(run.max_restarts),
        ]  # fmt: skip
        return [*torchrun, *program.trainer_program(run, self.folders)]

    def world_size(self, run: Run) -> int:
        """One torchrun on this host: its processes."""
        return run.nproc_per_node

    def check_fits(self, spec: RunCreate) -> None:
        """This host's process slots, and whether it has the GPUs an option needs."""
        if spec.nproc_per_node > self.capacity:
            what = f"{self.gpu_count} GPUs" if self.gpu_count else f"{self.capacity} process slots"
            raise FieldInvalid("nproc_per_node", f"this host has {what}; ask for at most {self.capacity}")
        if self.gpu_count:
            return
        for option, reason in wire.cuda_only(precision=spec.precision, sync_batchnorm=spec.sync_batchnorm).items():
            raise FieldInvalid(option, f"this host has no GPU: {reason}")
        if spec.nccl_env:
            raise FieldInvalid(
                "nccl_env", "this host has no GPU, so runs use gloo and NCCL never reads these variables"
            )

    def places(self, run: Run, free: Sequence[int]) -> list[int] | None:
        """The first free slots, one a process, once there are enough of them."""
        return list(free[: run.nproc_per_node]) if run.nproc_per_node <= len(free) else None

    def start(self, run: Run, *, token: str, devices: list[int]) -> Launch:
        """Starts the run's torchrun under the exit-recording waiter, in a process session of its own."""
        run_dir = self.folders.run_dir(run)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.folders.checkpoint_dir(run).mkdir(parents=True, exist_ok=True)
        (run_dir / EXIT_FILE).unlink(missing_ok=True)
        launch_id = uuid.uuid4().hex
        command = self.trainer_command(run)
        waiter = [sys.executable, "-m", "app.launcher.waiter", str(run_dir / EXIT_FILE), "--", *command]
        with open(run_dir / LAUNCHER_LOG, "ab") as log:
            log.write(f"{LAUNCH_MARKER}{launch_id} ---\n".encode())  # a resumed run appends: where this one begins
            log.flush()
            with cpus.everywhere(self.run_cpus):
                child = subprocess.Popen(
                    waiter, cwd=run_dir, env=self._environment(run, token, launch_id, devices),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
        self._children[child.pid] = child
        where = f"GPUs {devices}" if self.gpu_count else f"{len(devices)} CPU process slots"
        description = f"torchrun started (pid {child.pid}) on {where}"
        return Launch(launch_id, child.pid, processes.start_ticks(child.pid), command, description)

    def scheduler_options(self, run: Run, *, groups: Sequence[str]) -> dict[str, str | int]:
        return {}  # the server's own queue is this host's scheduler

    def refresh(self, runs: Sequence[Run]) -> None:
        """Nothing to gather: /proc answers each run at once."""

    def observe(self, run: Run) -> JobView | None:
        return None  # no scheduler on this host

    def verdict(self, run: Run) -> tuple[RunStatus, str] | None:
        return None  # the exit code the waiter recorded says it all

    def requeue(self, run: Run) -> Requeue | None:
        return None  # torchrun's own --max-restarts restarts a run here

    def _environment(self, run: Run, token: str, launch_id: str, devices: list[int]) -> dict[str, str]:
        env = dict(os.environ)
        env.update(program.trainer_environment(
            run, folders=self.folders, server_url=self.settings.trainer_url, token=token, launch_id=launch_id
        ))  # fmt: skip
        # A stop reaches torchrun, which SIGTERMs the ranks and SIGKILLs them 30 s later unless told otherwise: a rank
        # still saving must get the whole grace the server promises. By the variable, not --shutdown-timeout: a torch
        # older than that option would refuse it and fail the run, and ignores the variable.
        env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(math.ceil(self.settings.stop_grace_s))
        if self.gpu_count:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's indices are then NVML's, which `devices` holds
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)
        env.update(run.nccl_env or {})
        return env

    def worker_failures(self, run: Run) -> list[str]:
        """Each worker death torchrun has logged for this launch, oldest first, as a person reads it."""
        try:
            with open(self.folders.run_dir(run) / LAUNCHER_LOG, "rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(0, size - LAUNCHER_LOG_READ))
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return []
        return [describe_failure(*match.groups()) for match in WORKER_FAILURE.finditer(latest_launch(text))]

    def exit_code(self, run: Run) -> int | None:
        """The exit code the waiter recorded, or None while the run has not ended (or its waiter was killed)."""
        self._reap()
        return read_exit_code(self.folders.run_dir(run) / EXIT_FILE)

    def is_alive(self, run: Run) -> bool:
        self._reap()
        return run.pid is not None and processes.is_alive(run.pid, run.pid_start_ticks)

    def terminate(self, run: Run) -> None:
        """Asks the run to stop: SIGTERM to its session; torchrun passes it on to every worker."""
        if run.pid is not None and processes.is_alive(run.pid, run.pid_start_ticks):
            processes.signal_group(run.pid, signal.SIGTERM)

    def kill(self, run: Run) -> int:
        """SIGKILL to every process of the run, wherever torchrun put it; returns how many there were."""
        pids = processes.pids_with_env(wire.ENV_LAUNCH_ID, run.launch_id) if run.launch_id else []
        processes.kill_all(pids)
        return len(pids)

    def _reap(self) -> None:
        # Children this server started must be waited for, or they linger as zombies.
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]


def latest_launch(text: str) -> str:
    """What the latest launch of a run wrote to its launcher.log: a resumed run appends to the same file."""
    begins = text.rfind(LAUNCH_MARKER)
    return text[begins:] if begins >= 0 else text


def read_exit_code(path: Path) -> int | None:
    """The exit code in an exit record (the waiter's, or a Slurm job script's); None while there is none."""
    try:
        return int(json.loads(path.read_text())["exit_code"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def describe_failure(exit_code: str, local_rank: str, pid: str) -> str:
    """A worker death torchrun logged, as a person reads it."""
    code = int(exit_code)
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else ""
    return f"local rank {int(local_rank)} (pid {int(pid)}) {how or f'exited with {code}'}"
