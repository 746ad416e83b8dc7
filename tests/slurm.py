"""A throwaway Slurm cluster of one node for the tests: munged, slurmctld and slurmd on localhost, no systemd.

The recipe and its traps are in the project's notes on Slurm: munge's key from Debian's package, a slurm.conf in a
temporary folder (clients find it through SLURM_CONF), state and spool folders of our own, every wait bounded, and
on the way out `scontrol shutdown` and munged stopped by its pid file, only when this fixture started it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from app.launcher import processes

MUNGE_DIRS = (Path("/run/munge"), Path("/var/log/munge"), Path("/var/lib/munge"))
MUNGE_PID = Path("/run/munge/munged.pid")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


def slurm_missing() -> str | None:
    """Why Slurm cannot be started here (None when it can): the programs, or root to start the daemons."""
    absent = [name for name in DAEMONS if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists()]
    if absent:
        return f"not installed: {', '.join(absent)} (scripts/test installs slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "starting slurmd and munged needs root"
    return None


def wait_for(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    """Polls `check()` until it is true; raises TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s:.0f} s")
        time.sleep(0.2)


def _munge_works() -> bool:
    encoded = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
    if encoded.returncode != 0:
        return False
    return subprocess.run(["unmunge"], input=encoded.stdout, capture_output=True, timeout=10).returncode == 0


@contextmanager
def munge() -> Iterator[None]:
    """munged as the munge user, started unless one already answers; stopped by its pid file if we started it."""
    if _munge_works():
        yield
        return
    for folder in MUNGE_DIRS:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.chown(folder, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True, capture_output=True, timeout=30)
    try:
        wait_for("munged answering", _munge_works, START_TIMEOUT_S)
        yield
    finally:
        with suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(MUNGE_PID.read_text()), signal.SIGTERM)


def slurm_conf(root: Path, *, ctld_port: int, slurmd_port: int) -> str:
    """A slurm.conf for one node, this host, with every path under `root`."""
    host = socket.gethostname().split(".")[0]
    mem_mb = _mem_total_mb() - 1024
    cpus = os.cpu_count() or 1
    return "\n".join([
        "ClusterName=ci", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=slurm", "SlurmdUser=root",
        f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge", "CredType=cred/munge", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        # slurmctld runs as the slurm user: its files go in the one folder that user owns.
        "ReturnToService=2", f"SlurmctldPidFile={root}/slurmctld/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmdSpoolDir={root}/slurmd", f"StateSaveLocation={root}/slurmctld",
        f"SlurmctldLogFile={root}/slurmctld/slurmctld.log", f"SlurmdLogFile={root}/slurmd.log",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/filetxt", f"JobCompLoc={root}/slurmctld/jobcomp.log", "KillWait=5", "MinJobAge=600",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n"  # fmt: skip


def _mem_total_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("/proc/meminfo has no MemTotal")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_state(env: dict[str, str]) -> str:
    """What `sinfo` says of the node: idle, mix, alloc, down..."""
    found = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, env=env, timeout=10)
    return found.stdout.strip()


@contextmanager
def slurm_cluster() -> Iterator[dict[str, str]]:
    """Starts munged (if needed), slurmctld and slurmd; yields the environment that points Slurm's clients at them."""
    # Not pytest's tmp_path: slurmctld runs as the slurm user and must write its state here.
    root = Path(tempfile.mkdtemp(prefix="rankboard-slurm-"))
    os.chmod(root, 0o755)
    for name in ("slurmctld", "slurmd"):
        (root / name).mkdir()
    shutil.chown(root / "slurmctld", "slurm", "slurm")
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, ctld_port=_free_port(), slurmd_port=_free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    with munge():
        try:
            subprocess.run(["/usr/sbin/slurmctld", "-f", str(conf)], check=True, capture_output=True, env=env,
                           timeout=30)  # fmt: skip
            subprocess.run(["/usr/sbin/slurmd", "-f", str(conf)], check=True, capture_output=True, env=env, timeout=30)
            wait_for(f"the Slurm node idle (see {root})", lambda: node_state(env) == "idle", START_TIMEOUT_S)
            yield env
        finally:
            _shutdown(root, env)
            shutil.rmtree(root, ignore_errors=True)


def _shutdown(root: Path, env: dict[str, str]) -> None:
    """Cancels every job, asks both daemons to stop, and kills by pid file whichever outlives the wait."""
    with suppress(subprocess.SubprocessError):
        subprocess.run(["scancel", "--full", "--signal=KILL", "--user=root"], env=env, capture_output=True, timeout=10)
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True, timeout=10)
    pids = [_pid(root / "slurmctld" / "slurmctld.pid"), _pid(root / "slurmd.pid")]
    with suppress(TimeoutError):
        wait_for("the Slurm daemons gone", lambda: not any(_alive(pid) for pid in pids), STOP_TIMEOUT_S)
    for pid in pids:
        if pid is not None and _alive(pid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # A slurmstepd can outlive its slurmd (seen after a requeue): whatever still runs with this cluster's config goes.
    processes.kill_all(processes.pids_with_env("SLURM_CONF", env["SLURM_CONF"]))


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
