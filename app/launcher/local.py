"""The local launcher: one `torchrun --standalone` per run on this host, never through a shell."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from app.launcher import processes
from app.models import Run
from app.settings import Settings
from trainer import wire

EXIT_FILE = "exit.json"


@dataclass(frozen=True)
class Launch:
    """What the launcher started, as the run records it."""

    launch_id: str
    pid: int
    start_ticks: int | None
    command: list[str]


def detect_gpu_count() -> int:
    """GPUs NVML can see on this host; 0 without a driver (NVML is optional on the server)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no package, no library, no driver: all mean "no GPU here"
        return 0


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
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--standalone", f"--nproc-per-node={run.nproc_per_node}",
            "--log-dir", str(self.run_dir(run) / "ranks"), "--redirects", "3",
            "--max-restarts", "0",
            "-m", "trainer",
            "--workload", run.workload, "--epochs", str(run.epochs), "--batch-size", str(run.batch_size),
            "--lr", repr(run.lr), "--checkpoint-every", str(run.checkpoint_every), "--seed", str(run.seed),
            "--checkpoint-dir", str(self.checkpoint_dir(run)),
            "--keep-last", str(run.keep_last), "--keep-best", str(run.keep_best), "--best-metric", run.best_metric,
            *(["--init-from", str(self.settings.shared / run.init_from),
               "--init-optimizer", str(run.init_optimizer).lower()] if run.init_from else []),
        ]  # fmt: skip

    def start(self, run: Run, *, token: str, devices: list[int]) -> Launch:
        """Starts the run's torchrun under the exit-recording waiter, in a process session of its own."""
        run_dir = self.run_dir(run)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir(run).mkdir(parents=True, exist_ok=True)
        (run_dir / EXIT_FILE).unlink(missing_ok=True)
        launch_id = uuid.uuid4().hex
        command = self.trainer_command(run)
        waiter = [sys.executable, "-m", "app.launcher.waiter", str(run_dir / EXIT_FILE), "--", *command]
        with open(run_dir / "launcher.log", "ab") as log:
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
        return env

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
