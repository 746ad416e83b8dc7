"""The local launcher: one `torchrun --standalone` per run on this host, never through a shell."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from app.launcher import processes
from app.models import Run
from app.settings import Settings
from trainer import gpu, wire

EXIT_FILE = "exit.json"
LAUNCHER_LOG = "launcher.log"  # torchrun's own output; the ranks' goes to ranks/
# The run's columns that `python -m trainer` takes as flags of the same names.
TRAINER_OPTIONS = (
    "workload", "epochs", "batch_size", "lr", "optimizer", "lr_schedule", "warmup_steps", "weight_decay", "grad_clip",
    "grad_accum", "precision", "sync_batchnorm", "find_unused_parameters", "bucket_cap_mb", "gradient_as_bucket_view",
    "val_every", "checkpoint_every", "checkpoint_unit", "seed", "pg_timeout_s", "keep_last", "keep_best",
    "best_metric",
)  # fmt: skip
LAUNCHER_LOG_READ = 4 * 1024 * 1024  # torchrun's agent says little: its failures are in the end of the file
# What torchrun's agent logs when a worker dies: "failed (exitcode: -9) local_rank: 1 (pid: 15366) of binary: ..."
WORKER_FAILURE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
LAUNCH_MARKER = "--- rankboard launch "  # begins the line written to launcher.log before each launch of a run


@dataclass(frozen=True)
class Launch:
    """What the launcher started, as the run records it."""

    launch_id: str
    pid: int
    start_ticks: int | None
    command: list[str]


def detect_gpu_count() -> int:
    """GPUs NVML can see on this host, through the same interface the samplers use; 0 without a driver."""
    try:
        nvml = gpu.open_nvml()
    except gpu.NvmlUnavailable:
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError:
        return 0
    finally:
        nvml.nvmlShutdown()


class LocalLauncher:
    """Starts, signals and inspects the runs of this host."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.gpu_count = detect_gpu_count()
        self.capacity = settings.slots or self.gpu_count or os.cpu_count() or 1
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def run_dir(self, run: Run) -> Path:
        return self.settings.shared / "logs" / run.folder

    def checkpoint_dir(self, run: Run) -> Path:
        return self.settings.shared / "checkpoints" / run.folder

    def trainer_command(self, run: Run) -> list[str]:
        """The torchrun command line of a run, as a list: no shell ever sees it."""
        torchrun = [
            sys.executable, "-m", "torch.distributed.run",
            "--standalone", f"--nproc-per-node={run.nproc_per_node}",
            "--log-dir", str(self.run_dir(run) / "ranks"), "--redirects", "3",
            "--max-restarts", str(run.max_restarts),
        ]  # fmt: skip
        if run.script:
            return [*torchrun, run.script, *(run.script_args or [])]
        options = {name: getattr(run, name) for name in TRAINER_OPTIONS}
        if run.init_from:
            options.update(init_from=str(self.settings.shared / run.init_from), init_optimizer=run.init_optimizer)
        flags = [(f"--{name.replace('_', '-')}", wire.flag_value(value)) for name, value in options.items()]
        return [*torchrun, "-m", "trainer", *itertools.chain.from_iterable(flags),
                "--checkpoint-dir", str(self.checkpoint_dir(run))]  # fmt: skip

    def start(self, run: Run, *, token: str, devices: list[int]) -> Launch:
        """Starts the run's torchrun under the exit-recording waiter, in a process session of its own."""
        run_dir = self.run_dir(run)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir(run).mkdir(parents=True, exist_ok=True)
        (run_dir / EXIT_FILE).unlink(missing_ok=True)
        launch_id = uuid.uuid4().hex
        command = self.trainer_command(run)
        waiter = [sys.executable, "-m", "app.launcher.waiter", str(run_dir / EXIT_FILE), "--", *command]
        with open(run_dir / LAUNCHER_LOG, "ab") as log:
            log.write(f"{LAUNCH_MARKER}{launch_id} ---\n".encode())  # a resumed run appends: where this one begins
            log.flush()
            child = subprocess.Popen(
                waiter, cwd=run_dir, env=self._environment(run, token, launch_id, devices),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self._children[child.pid] = child
        return Launch(launch_id, child.pid, processes.start_ticks(child.pid), command)

    def _environment(self, run: Run, token: str, launch_id: str, devices: list[int]) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            wire.ENV_RUN_ID: str(run.id),
            wire.ENV_SERVER_URL: self.settings.trainer_url,
            wire.ENV_TOKEN: token,
            wire.ENV_RUN_DIR: str(self.run_dir(run)),
            wire.ENV_CHECKPOINT_DIR: str(self.checkpoint_dir(run)),
            wire.ENV_LAUNCH_ID: launch_id,
            "PYTHONUNBUFFERED": "1",
            # Restarted workers must not reuse the agent's rendezvous store (pytorch/pytorch#135712).
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        })  # fmt: skip
        if self.gpu_count:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)
        env.update(run.nccl_env or {})
        return env

    def worker_failures(self, run: Run) -> list[str]:
        """Each worker death torchrun has logged for this launch, oldest first, as a person reads it."""
        try:
            with open(self.run_dir(run) / LAUNCHER_LOG, "rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(0, size - LAUNCHER_LOG_READ))
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return []
        return [_describe_failure(*match.groups()) for match in WORKER_FAILURE.finditer(latest_launch(text))]

    def exit_code(self, run: Run) -> int | None:
        """The exit code the waiter recorded, or None while the run has not ended (or its waiter was killed)."""
        self._reap()
        try:
            return int(json.loads((self.run_dir(run) / EXIT_FILE).read_text())["exit_code"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def trainer_finished(self, run: Run) -> bool:
        """True when rank 0 wrote its completion marker: training ran to its end whatever torchrun's exit code."""
        return (self.run_dir(run) / wire.FINISHED_MARKER).exists()

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


def _describe_failure(exit_code: str, local_rank: str, pid: str) -> str:
    code = int(exit_code)
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else ""
    return f"local rank {int(local_rank)} (pid {int(pid)}) {how or f'exited with {code}'}"
