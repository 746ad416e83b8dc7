"""The Slurm launcher: a run is one batch job, `srun` starting one torchrun agent per node, c10d rendezvous.

Slurm schedules, queues and places; this module only writes the job script, submits it, asks squeue (once per poll
for every live run) and signals the job. Every command is an argv list; the script is built from validated values,
each one quoted, and the run's token travels in the job's environment, never in the script file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rankboard import wire

from app.core.errors import FieldInvalid
from app.core.folders import RunFolders
from app.core.models import Run, RunStatus
from app.core.settings import Settings
from app.launcher import program
from app.launcher.interface import JobView, Launch, LaunchRefused, Requeue
from app.launcher.local import EXIT_FILE, LAUNCH_MARKER, TAKES_BATCHES, WORKER_FAILURE, describe_failure, read_exit_code
from app.schemas.runs import RunCreate

log = logging.getLogger(__name__)

JOB_SCRIPT = "job.sbatch"  # in the run's folder, shown on the run page
WARNED = "slurm-time-limit-warning"  # the batch shell leaves it in the run's folder when Slurm's USR2 came
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"  # torchrun forwards only the first four by default, and dies of USR2
WARNING_LEAD_S = 60  # besides the grace period: how long before the time limit Slurm warns, to finish a step
OUTPUT_FILE = "slurm-%j.out"  # Slurm's own output of the batch shell and of srun, beside the ranks' logs
SQUEUE_FORMAT = "%i|%T|%r|%N"
COMMAND_TIMEOUT_S = 30.0
# slurmd refuses a job whose credential is dated in the same second as the revocation of its previous attempt's
# ("Killing non-startable batch job: Job credential revoked"): a requeued job starts this many seconds later.
REQUEUE_START_DELAY_S = 2
OUTPUT_READ = 4 * 1024 * 1024
SQUEUE_BACKOFF_MAX_S = 60.0
HELD = "JobHeldUser"  # squeue's reason for a job submitted with --hold
# A job id as sbatch prints it and squeue lists it: 123, 123_4 (array), 123+1 (heterogeneous).
JOB_ID = re.compile(r"^\d+([_+]\d+)?$")

WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"})
RUNNING = frozenset({"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED"})
RESUME_HINT = "resume it to continue from its newest snapshot"
# How a job that Slurm ended says the run ended, when neither the trainer's marker nor a stop request decides.
# COMPLETED and FAILED are absent: the exit code the batch script recorded says more than they do.
ENDINGS: dict[str, tuple[RunStatus, str]] = {
    "CANCELLED": (RunStatus.stopped, "cancelled outside Rankboard (Slurm: CANCELLED)"),
    "TIMEOUT": (RunStatus.failed, f"timed out: Slurm's time limit was reached; {RESUME_HINT}"),
    "PREEMPTED": (RunStatus.failed, f"preempted by Slurm; {RESUME_HINT}"),
    "NODE_FAIL": (RunStatus.failed, "node failure on {nodes}; " + RESUME_HINT),
    "BOOT_FAIL": (RunStatus.failed, "node failure on {nodes} (it did not boot); " + RESUME_HINT),
    "OUT_OF_MEMORY": (RunStatus.failed, "a node ran out of memory (Slurm: OUT_OF_MEMORY)"),
    "DEADLINE": (RunStatus.failed, f"Slurm's deadline for the job passed; {RESUME_HINT}"),
}

AGENT_LOGS = "agent"  # each agent's --log-dir: <run>/ranks/agent<SLURM_PROCID>, so that its ranks' folders differ
# Runs in each task (bash -c), so that SLURM_PROCID is that task's: only task 0's agent hosts the c10d store, and each
# agent writes its ranks' logs into a folder of its own (the run folder comes in the job's environment).
AGENT = (
    'exec "$0" -m torch.distributed.run --rdzv-conf=is_host=$(( SLURM_PROCID == 0 ? 1 : 0 )) '
    f'--log-dir="${{{wire.ENV_RUN_DIR}:?}}/ranks/{AGENT_LOGS}$SLURM_PROCID" "$@"'
)
# Trap 4 of the Slurm notes: a signal to the batch shell runs its trap only once the foreground command returns, so
# srun runs in the background and the shell waits until it is really gone.
WAIT_FOR_SRUN = 'SRUN=$!\nwhile :; do wait "$SRUN"; rc=$?; kill -0 "$SRUN" 2>/dev/null || break; done'


def slurm_available() -> bool:
    """Whether this host can submit jobs: Slurm's client commands are on the PATH."""
    return all(shutil.which(name) for name in ("sbatch", "squeue", "scancel", "sinfo"))


def describe(job: JobView) -> str:
    """The job's state as the run page says it."""
    if job.state in WAITING:
        return f"queued in Slurm ({job.reason})" if job.reason and job.reason != "None" else "queued in Slurm"
    if job.state in RUNNING:
        return f"running on {job.nodes}" if job.nodes else "running"
    return f"ended in Slurm: {job.state}"


def ending(job: JobView) -> tuple[RunStatus, str] | None:
    """What Slurm's final state says of the run; None where the recorded exit code should decide."""
    found = ENDINGS.get(job.state)
    if found is None:
        return None
    status, reason = found
    return status, reason.format(nodes=job.nodes or "an unnamed node")


def job_name(run: Run) -> str:
    """The run's job name: its id and a digest of when it was created, so that the server finds its own submission
    again (one whose reply was lost) and never another server's run of the same id."""
    digest = hashlib.sha256(f"{run.id}|{run.created_at}".encode()).hexdigest()[:8]
    return f"rankboard-run-{run.id}-{digest}"


def parse_squeue(text: str) -> dict[str, JobView]:
    """squeue's `%i|%T|%r|%N` lines by job id; lines that are not a job (a warning) are left out."""
    jobs = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 4 and JOB_ID.match(fields[0]):
            job = JobView(fields[1], fields[2], fields[3], waiting=fields[1] in WAITING, running=fields[1] in RUNNING)
            jobs[fields[0]] = dataclasses.replace(job, words=f"Slurm job {fields[0]}: {describe(job)}")
    return jobs


@dataclass(frozen=True)
class JobOptions:
    """The validated Slurm options of one run, with the server's defaults filled in."""

    job_name: str
    nodes: int
    agents_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    time_limit: str
    partition: str | None
    account: str | None
    qos: str | None
    nice: int | None
    constraint: str | None
    requeue: bool
    grace_s: int  # how long the ranks may take to checkpoint after a stop or the time-limit warning

    @classmethod
    def of(cls, run: Run, settings: Settings) -> JobOptions:
        """The run's options; what it leaves empty comes from the server's settings."""
        return cls(
            job_name=job_name(run), nodes=run.slurm_nodes, agents_per_node=settings.slurm_agents_per_node,
            cpus_per_task=run.slurm_cpus_per_task, gpus_per_node=run.slurm_gpus_per_node,
            time_limit=run.slurm_time_limit or settings.slurm_time_limit,
            partition=run.slurm_partition or settings.slurm_partition,
            account=run.slurm_account or settings.slurm_account, qos=run.slurm_qos, nice=run.slurm_nice,
            constraint=run.slurm_constraint,
            requeue=run.slurm_requeue, grace_s=math.ceil(settings.stop_grace_s),
        )  # fmt: skip

    def directives(self) -> list[str]:
        """The #SBATCH lines, each value quoted."""
        options = {
            "job-name": self.job_name, "nodes": self.nodes, "ntasks-per-node": self.agents_per_node,
            "cpus-per-task": self.cpus_per_task, "time": self.time_limit, "partition": self.partition,
            "account": self.account, "qos": self.qos, "nice": self.nice, "constraint": self.constraint,
            "gpus-per-node": self.gpus_per_node or None,
        }  # fmt: skip
        lines = [f"#SBATCH --{name}={shlex.quote(str(value))}" for name, value in options.items() if value is not None]
        # USR2 to the batch shell near the time limit; append, because a requeued job would truncate its output.
        return [*lines, f"#SBATCH --signal=B:USR2@{self.grace_s + WARNING_LEAD_S}", "#SBATCH --open-mode=append",
                "#SBATCH --requeue" if self.requeue else "#SBATCH --no-requeue"]  # fmt: skip


def agent_arguments(run: Run, folders: RunFolders) -> list[str]:
    """torchrun's options and the program, after `-m torch.distributed.run` and the per-task is_host."""
    return [
        "--nnodes=$SLURM_NTASKS", f"--nproc-per-node={run.nproc_per_node}", "--rdzv-backend=c10d",
        "--rdzv-endpoint=$HEAD:$PORT", "--rdzv-id=$SLURM_JOB_ID",
        "--redirects", "3",  # into each agent's own --log-dir, which AGENT names
        "--max-restarts", str(run.max_restarts), *program.trainer_program(run, folders),
    ]  # fmt: skip


def job_script(run: Run, *, options: JobOptions, folders: RunFolders, python: str = sys.executable) -> str:
    """The batch script: every value quoted, the rendezvous host from Slurm, the exit code recorded at the end."""
    expanded = {"--nnodes=$SLURM_NTASKS", "--rdzv-endpoint=$HEAD:$PORT", "--rdzv-id=$SLURM_JOB_ID"}
    arguments = " ".join(f'"{a}"' if a in expanded else shlex.quote(a) for a in agent_arguments(run, folders))
    exit_file = folders.run_dir(run) / EXIT_FILE
    # The batch shell alone gets Slurm's warning: it notes it for the server and passes it on to the agents.
    warned = f'touch {shlex.quote(str(folders.run_dir(run) / WARNED))}; scancel --signal=USR2 "$SLURM_JOB_ID.0"'

    return "\n".join([
        "#!/bin/bash",
        f"# Rankboard run {run.id}. The server submits it with the run's token in the job's environment.",
        *options.directives(),
        "set -uo pipefail",
        # Where this attempt begins in the output file, which a requeued job appends to: diagnosis reads from here.
        f'echo "{LAUNCH_MARKER}${{SLURM_JOB_ID:-}} attempt $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) ---"',
        'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"  # srun in Slurm 22.05 does not inherit it',
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        # Never localhost: on several nodes, each agent would rendezvous with itself and wait forever.
        'if [ -z "$HEAD" ]; then echo "rankboard: no head node in SLURM_JOB_NODELIST" >&2; exit 1; fi',
        "PORT=$(( 29500 + SLURM_JOB_ID % 10000 ))",
        f"trap {shlex.quote(warned)} USR2",
        # torchrun's options by their variables, which a torch too old for an option ignores where its command line
        # would refuse it and fail the run: pass USR2 on (it dies of it otherwise), and give the ranks the whole
        # grace (it SIGKILLs them 30 s after passing a signal on otherwise).
        f"export PET_SIGNALS_TO_HANDLE={SIGNALS} TORCH_ELASTIC_SHUTDOWN_TIMEOUT={options.grace_s}",
        f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(AGENT)} {shlex.quote(python)} {arguments} &",
        WAIT_FOR_SRUN,
        f"printf '{{\"exit_code\": %d}}\\n' \"$rc\" > {shlex.quote(str(exit_file))}.tmp",
        f"mv {shlex.quote(str(exit_file))}.tmp {shlex.quote(str(exit_file))}",
        'exit "$rc"',
        "",
    ])  # fmt: skip


class SlurmLauncher:
    """Submits, watches and cancels the runs that go through Slurm."""

    name = "slurm"
    joins = False
    kills = True
    host_slots = False
    scheduler = "Slurm"
    waits_for = "submission to Slurm"
    stop_words = "finishing the step, saving"

    @staticmethod
    def ranks(run: Run) -> int:
        # Stored before runs kept their size: its agents per node were never known, one is the least it had.
        return run.world_size or run.nproc_per_node * run.slurm_nodes

    @staticmethod
    def output_file(run: Run, folders: RunFolders) -> Path | None:
        """Slurm's output file of the run's job, once it was submitted."""
        return folders.run_dir(run) / OUTPUT_FILE.replace("%j", run.job_id) if run.job_id else None

    @staticmethod
    def output_label(run: Run) -> str:
        return f"Slurm output ({OUTPUT_FILE.replace('%j', run.job_id)})" if run.job_id else "Slurm output"

    @staticmethod
    def job_script(run: Run, folders: RunFolders) -> Path | None:
        return folders.run_dir(run) / JOB_SCRIPT

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
        return "a scaling sweep runs on this host only, for now; this run is on Slurm"

    def __init__(self, settings: Settings, folders: RunFolders) -> None:
        self.settings = settings
        self.folders = folders
        self._jobs: dict[str, JobView] = {}
        self._listed_at = float("-inf")  # monotonic time of the last squeue that answered
        self._asked_at = float("-inf")
        self._submitted_at: dict[str, float] = {}
        self._poll_s = settings.slurm_poll_s

    def world_size(self, run: Run) -> int:
        """Each node runs `slurm_agents_per_node` torchrun agents, each with the run's processes per node."""
        return run.nproc_per_node * run.slurm_nodes * self.settings.slurm_agents_per_node

    def check_fits(self, spec: RunCreate) -> None:
        """The cluster's partitions and their sizes; GPUs for the options that need them."""
        partitions = self.partitions()
        if partitions is None:
            raise FieldInvalid("launcher", "Slurm does not answer (sinfo failed); try again, or run on this host")
        partition = spec.slurm_partition or self.settings.slurm_partition
        if partition is not None and partition not in partitions:
            known = ", ".join(sorted(partitions)) or "none"
            raise FieldInvalid("slurm_partition", f"Slurm has no partition {partition!r}; it has: {known}")
        most = partitions[partition] if partition is not None else max(partitions.values(), default=0)
        if spec.slurm_nodes > most:
            where = f"partition {partition!r}" if partition else "the cluster"
            raise FieldInvalid("slurm_nodes", f"{where} has {most} nodes; ask for at most {most}")
        if spec.slurm_gpus_per_node and spec.nproc_per_node > spec.slurm_gpus_per_node:
            raise FieldInvalid("nproc_per_node", f"one process per GPU: at most {spec.slurm_gpus_per_node} per node")
        if spec.slurm_gpus_per_node:
            return
        for option, reason in wire.cuda_only(precision=spec.precision, sync_batchnorm=spec.sync_batchnorm).items():
            raise FieldInvalid(option, f"the Slurm job asks for no GPU: {reason}")

    def places(self, run: Run, free: Sequence[int]) -> list[int] | None:
        """No device of this host, and at once: Slurm queues it."""
        return []

    def scheduler_options(self, run: Run, *, groups: Sequence[str]) -> dict[str, str | int]:
        """The server's mapping (settings.slurm_mapping) of the run's priority and owner to QoS, niceness, account and
        partition, each where the run named none: Slurm's own scheduler then decides, with its own limits."""
        choice = self.settings.slurm_mapping.choose(priority=run.priority, owner=run.owner or "", groups=list(groups))
        mapped = {"slurm_qos": choice.qos, "slurm_nice": choice.nice, "slurm_account": choice.account,
                  "slurm_partition": choice.partition}  # fmt: skip
        return {column: value for column, value in mapped.items() if value is not None and getattr(run, column) is None}

    def start(self, run: Run, *, token: str, devices: list[int]) -> Launch:
        """Writes the job script into the run's folder and submits it with `sbatch --parsable`."""
        run_dir = self.folders.run_dir(run)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.folders.checkpoint_dir(run).mkdir(parents=True, exist_ok=True)
        (run_dir / EXIT_FILE).unlink(missing_ok=True)
        (run_dir / WARNED).unlink(missing_ok=True)
        script = run_dir / JOB_SCRIPT
        script.write_text(job_script(run, options=JobOptions.of(run, self.settings), folders=self.folders))
        launch_id = uuid.uuid4().hex
        self._cancel_lost_submissions(run)
        # Held until the job id is on record (refresh releases it): a reply lost now leaves a job that never runs.
        command = ["sbatch", "--parsable", "--hold", f"--output={run_dir / OUTPUT_FILE}", f"--chdir={run_dir}",
                   str(script)]  # fmt: skip
        env = self._environment(run, token, launch_id)
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise LaunchRefused(f"sbatch could not be run: {error}") from None
        job_id = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not JOB_ID.match(job_id):
            raise LaunchRefused(done.stderr.strip() or f"sbatch exited with {done.returncode}: {done.stdout.strip()}")
        self._submitted_at[job_id] = time.monotonic()
        return Launch(launch_id, None, None, command, f"submitted to Slurm as job {job_id}", job_id=job_id)

    def _cancel_lost_submissions(self, run: Run) -> None:
        """Cancels the jobs of an earlier submission of the run whose reply never reached the database (the server
        died, or sbatch timed out after submitting): they wait, held, under the run's job name."""
        name = job_name(run)
        listed = self._command(["squeue", "--noheader", "--states=all", f"--name={name}", f"--format={SQUEUE_FORMAT}"])
        if listed is None:
            raise LaunchRefused("squeue did not answer, so an earlier submission of this run cannot be ruled out")
        for job_id, job in parse_squeue(listed).items():
            if job.state in WAITING or job.state in RUNNING:
                log.warning("cancelling Slurm job %s: an earlier submission of run %d whose reply was lost", job_id,
                            run.id)  # fmt: skip
                self._command(["scancel", job_id])

    def _command(self, argv: list[str]) -> str | None:
        """A Slurm client command's output; None (and a warning in the log) when it fails."""
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            log.warning("%s failed: %s", argv[0], error)
            return None
        if done.returncode != 0:
            log.warning("%s exited with %d: %s", argv[0], done.returncode, done.stderr.strip())
            return None
        return done.stdout

    def _environment(self, run: Run, token: str, launch_id: str) -> dict[str, str]:
        # A server that itself runs inside a Slurm job must not hand its own job's variables to the new one.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_")) or k == "SLURM_CONF"}
        env.update(program.trainer_environment(
            run, folders=self.folders, server_url=self.settings.trainer_url, token=token, launch_id=launch_id
        ))  # fmt: skip
        env.update(run.nccl_env or {})
        return env

    def refresh(self, runs: Sequence[Run]) -> None:
        """One squeue for every live Slurm run, at most every `slurm_poll_s`, and less often while squeue fails (it
        keeps its last answer); then releases the jobs submitted held whose ids are now on record."""
        now = time.monotonic()
        # A job not yet seen (job_state None) waits, held, for its release: it is not kept waiting a poll interval,
        # unless squeue is failing.
        fresh = any(run.job_id and run.job_state is None for run in runs)
        failing = self._poll_s > self.settings.slurm_poll_s
        wait = self._poll_s if failing or not fresh else 0.0
        if not any(run.job_id for run in runs) or now - self._asked_at < wait:
            return
        self._asked_at = now
        listed = self._command(["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"])
        if listed is None:  # slurmctld away or overloaded: ask it less often, up to a minute apart
            self._poll_s = min(self._poll_s * 2, max(SQUEUE_BACKOFF_MAX_S, self.settings.slurm_poll_s))
            return
        self._jobs, self._listed_at, self._poll_s = parse_squeue(listed), now, self.settings.slurm_poll_s
        for run in runs:
            job = self.observe(run)
            # job_state is None: the server has not seen this job before, so it is the one it submitted held.
            held = job is not None and job.reason == HELD and run.job_state is None
            if held and run.job_id and self._scontrol(["release", run.job_id]):
                self._jobs.pop(run.job_id)  # its listing says held: alive until the next one says more
                self._submitted_at[run.job_id] = time.monotonic()

    def observe(self, run: Run) -> JobView | None:
        return self._jobs.get(run.job_id) if run.job_id else None

    def verdict(self, run: Run) -> tuple[RunStatus, str] | None:
        if (self.folders.run_dir(run) / WARNED).exists():
            return RunStatus.failed, f"Slurm's time limit was near: the run checkpointed and stopped; {RESUME_HINT}"
        job = self.observe(run)
        return ending(job) if job is not None else None

    def requeue(self, run: Run) -> Requeue | None:
        """After the time-limit warning, and with requeues left: the same job back in the queue, to start at once."""
        run_dir = self.folders.run_dir(run)
        allowed = run.slurm_requeue and run.attempt <= run.slurm_max_requeues
        if run.job_id is None or not allowed or not (run_dir / WARNED).exists():
            return None
        if self.is_alive(run):
            return Requeue(waiting=True)  # the batch shell is still ending: a live job cannot be requeued yet
        requeued = self._scontrol(["requeue", run.job_id])
        # A requeued job waits for BeginTime (about two minutes) unless told when to start.
        start = f"StartTime=now+{REQUEUE_START_DELAY_S}"
        if not requeued or not self._scontrol(["update", f"JobId={run.job_id}", start]):
            return None
        (run_dir / WARNED).unlink(missing_ok=True)
        (run_dir / EXIT_FILE).unlink(missing_ok=True)
        # Its last listing says FAILED or COMPLETED: forget it, so that it counts as alive until squeue lists it again.
        self._jobs.pop(run.job_id, None)
        self._submitted_at[run.job_id] = time.monotonic()
        return Requeue(f"Slurm's time limit was near; requeued as job {run.job_id}, resuming from its newest snapshot")

    def _scontrol(self, arguments: list[str]) -> bool:
        return self._command(["scontrol", *arguments]) is not None

    def exit_code(self, run: Run) -> int | None:
        """The exit code the batch script recorded at its end; None while it runs, or when Slurm killed it."""
        return read_exit_code(self.folders.run_dir(run) / EXIT_FILE)

    def is_alive(self, run: Run) -> bool:
        """True while Slurm lists the job as waiting or running, or has not listed anything since it was submitted."""
        job = self.observe(run)
        if job is not None:
            return job.state in WAITING or job.state in RUNNING
        if run.job_id is None:
            return False
        # No answer from squeue yet (a server just restarted, slurmctld away), or none since the submission: a job is
        # not declared gone on a guess. Heartbeats stay the first sign of life.
        submitted = self._submitted_at.get(run.job_id, float("-inf"))
        return self._listed_at == float("-inf") or self._listed_at < submitted

    def terminate(self, run: Run) -> None:
        """SIGTERM to the job's steps: torchrun passes it to the ranks, which checkpoint; a queued job is cancelled."""
        job = self.observe(run)
        waiting = job is not None and job.state in WAITING
        self._scancel(run, [] if waiting else ["--signal=TERM"])

    def kill(self, run: Run) -> int:
        """Cancels the job (Slurm sends TERM, then KILL after KillWait); returns 1 when it was still live."""
        if not self.is_alive(run):
            return 0
        self._scancel(run, [])
        return 1

    def _scancel(self, run: Run, options: list[str]) -> None:
        if run.job_id is not None:
            self._command(["scancel", *options, run.job_id])

    def worker_failures(self, run: Run) -> list[str]:
        """Each worker death the agents logged into Slurm's output file of the job, oldest first."""
        path = self.folders.run_dir(run) / OUTPUT_FILE.replace("%j", run.job_id or "")
        try:
            with open(path, "rb") as output:
                output.seek(max(0, output.seek(0, os.SEEK_END) - OUTPUT_READ))
                text = output.read().decode(errors="replace")
        except FileNotFoundError:
            return []
        return [describe_failure(*match.groups()) for match in WORKER_FAILURE.finditer(text)]

    def partitions(self) -> dict[str, int] | None:
        """The cluster's partitions and their node counts, from sinfo; None when sinfo does not answer."""
        listed = self._command(["sinfo", "--noheader", "--format=%R|%D"])
        if listed is None:
            return None
        found: dict[str, int] = {}
        for line in listed.splitlines():
            name, _bar, count = line.strip().partition("|")
            if count.isdigit():
                found[name] = found.get(name, 0) + int(count)
        return found
