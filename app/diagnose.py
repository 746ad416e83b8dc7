"""Failures explained: known causes recognised in the ranks' logs and the launcher's (Slurm's), with what to do.

The wording follows the troubleshooting table of the DDP checklist. Only text is looked at here (the service reads
the bounded tails of the files); nothing is guessed from the exit code alone. When several ranks fail, the first
one to fail is the one worth reading: torchrun names it in its "Root Cause (first observed failure)" block, and
without that block the rank whose log stopped changing first is taken, since the others usually died of its death.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LogText:
    """The tail of one log file: `rank` is None for the launcher's own output (torchrun's agent)."""

    rank: int | None
    stream: str
    text: str
    modified: float = 0.0


@dataclass(frozen=True)
class Diagnosis:
    """One recognised failure: what it is, its likely cause, what to do, and the line that gave it away."""

    kind: str
    title: str
    cause: str
    advice: str
    rank: int | None
    line: str
    ranks: list[int] = field(default_factory=list)  # every rank whose log shows it
    traceback: str | None = None


@dataclass(frozen=True)
class Pattern:
    kind: str
    title: str
    regex: re.Pattern[str]
    cause: str
    advice: str


# Slurm's own lines in the job's output file (slurmstepd's and srun's, as 22.05 writes them), first: when Slurm ended a
# job, what the ranks and torchrun wrote as they died follows from it. "*** STEP n.0 ... CANCELLED AT t ***" with no
# reason is left out: srun --kill-on-bad-exit writes it when another task failed, which the ranks' logs explain.
SLURM_KILL = r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO "
PATTERNS = [
    Pattern(
        "slurm_oom", "Out of memory on the node (Slurm)",
        re.compile(r"Detected \d+ oom-kill event|oom-kill|OUT_OF_MEMORY|task \d+: Out Of Memory"),
        "A process of the job used more host memory than Slurm allowed it (the job's memory limit or the node's), "
        "and the kernel's out-of-memory killer ended it: often too many data-loader workers, or a dataset loaded "
        "whole into memory by every rank.",
        "Use fewer data-loader workers or a smaller batch, load the data lazily, or choose nodes with more memory "
        "(another partition or constraint); then resume the run from its newest snapshot.",
    ),
    Pattern(
        "slurm_node_failure", "Node failure (Slurm)",
        re.compile(SLURM_KILL + "NODE FAILURE"),
        "A node of the job stopped answering Slurm (hardware, network, or its slurmd died), so Slurm ended the job.",
        "Resume the run from its newest snapshot; if it happens again on the same node, tell the cluster's "
        "administrators and exclude the node.",
    ),
    Pattern(
        "slurm_time_limit", "Time limit reached (Slurm)",
        re.compile(SLURM_KILL + "TIME LIMIT"),
        "The job ran past its time limit and Slurm ended it before the ranks could checkpoint.",
        "Resume the run from its newest snapshot with a longer time limit, or allow requeues so that it checkpoints "
        "and continues in a new job; checkpoint more often if a snapshot is far behind.",
    ),
    Pattern(
        "slurm_preempted", "Preempted (Slurm)",
        re.compile(SLURM_KILL + "PREEMPTION"),
        "A job of higher priority needed the nodes, so Slurm preempted this one.",
        "Resume the run from its newest snapshot, or submit it to a partition or QOS that is not preempted.",
    ),
    Pattern(
        "slurm_cancelled", "Cancelled (Slurm)",
        re.compile(r"\*\*\* JOB \S+ ON \S+ CANCELLED AT \S+ \*\*\*"),
        "Someone cancelled the job with scancel: you, an administrator, or Rankboard itself when a stopped run's "
        "ranks did not end within the grace period.",
        "If you did not stop it, ask the cluster's administrators why; resume the run from its newest snapshot.",
    ),
    Pattern(
        "cuda_oom", "CUDA out of memory",
        re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError", re.IGNORECASE),
        "The batch is too large for the GPU's memory, or every rank put its model on the same GPU.",
        "Reduce the batch size, enable mixed precision, and check that each rank uses the GPU of its LOCAL_RANK.",
    ),
    Pattern(
        "desync", "A rank never reached the collective (desync check)",
        re.compile(r"Ranks? [\d, ]+ failed to pass monitoredBarrier"),
        "With TORCH_DISTRIBUTED_DEBUG=DETAIL every collective is preceded by a monitored barrier: the ranks this line "
        "names did not reach it in time while the others did. They hang, or took another path through the code.",
        "Read the named ranks' logs and the run's dump (\"Which rank, and why\"): where their stacks stand is where "
        "they stopped; a collective called on some ranks only (inside an if on the rank) is the usual cause.",
    ),
    Pattern(
        "nccl_timeout", "NCCL timeout",
        re.compile(r"Watchdog caught collective operation timeout|NCCL operations have failed or timed out|"
                   r"ProcessGroupNCCL's watchdog got stuck|Timeout at NCCL work"),
        "A rank died or hangs, so the others waited in a collective until the timeout; or not every GPU is visible.",
        "Find the rank that stopped first (its log ends earliest), check nvidia-smi on its node, and run again "
        "with NCCL_DEBUG=INFO to see where it hangs.",
    ),
    Pattern(
        "no_space", "No space left on device",
        re.compile(r"No space left on device|ENOSPC|\[Errno 28\]"),
        "Checkpoints or logs filled the shared disk.",
        "Delete old checkpoints (or keep fewer with keep-last/keep-best), or grow the disk quota.",
    ),
    Pattern(
        "not_torchrun", "Not started by torchrun",
        re.compile(r"KeyError: '(LOCAL_RANK|RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT)'|"
                   r"environment variable (LOCAL_RANK|RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT) expected|"
                   r"LOCAL_RANK is not set"),
        "The script was started with python, not torchrun, so the process group's variables "
        "(RANK, LOCAL_RANK, WORLD_SIZE) are missing.",
        "Launch it through torchrun (python -m torch.distributed.run --nproc-per-node=N script.py).",
    ),
    Pattern(
        "address_in_use", "Address already in use",
        re.compile(r"Address already in use|EADDRINUSE|\[Errno 98\]|"
                   r"server socket has failed to listen on any local network address", re.IGNORECASE),
        "The port of the rendezvous is still bound, usually by a previous run that has not exited yet.",
        "Use another port (MASTER_PORT or --rdzv-endpoint), or wait for the old run to exit.",
    ),
]  # fmt: skip

EXCEPTION_CAUSE = "The training script raised an exception that nothing caught, and its rank exited."
EXCEPTION_ADVICE = (
    "Read the traceback from the bottom: the last line is the error, the lines above it the place in the code. "
    "Fix it and start a new run; the other ranks stopped because this one did."
)
TRACEBACK_START = "Traceback (most recent call last):"
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:")  # torchrun --tee writes "[rank1]:" before each line
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?\n\s*rank\s*:\s*(\d+)", re.DOTALL)
MAX_TRACEBACK_LINES = 80
# torchrun's own tracebacks that are reports, not errors: a rank failed (its own traceback is the one to read), or
# torchrun was signalled (a stop asked for).
TORCHRUN_REPORTS = ("ChildFailedError", "SignalException")


@dataclass(frozen=True)
class Traceback:
    text: str
    last_line: str  # the exception itself: `ValueError: ...`


def diagnose(logs: Sequence[LogText]) -> list[Diagnosis]:
    """Every known failure found in `logs`, the rank that failed first before the others."""
    ordered = _first_failure_first(logs)
    found: list[Diagnosis] = []
    for pattern in PATTERNS:
        diagnosis = _match(pattern, ordered)
        if diagnosis is not None:
            found.append(diagnosis)
    # The last traceback of the rank that failed first: an earlier one in the same log was survived.
    first = next(((log, found_in[-1]) for log in ordered if (found_in := tracebacks(log))), None)
    if first is not None and not any(d.traceback == first[1].text for d in found):
        log, tb = first
        title = f"Python exception: {tb.last_line.split(':', 1)[0]}"
        found.append(Diagnosis("exception", title, EXCEPTION_CAUSE, EXCEPTION_ADVICE, log.rank, tb.last_line,
                               [log.rank] if log.rank is not None else [], tb.text))  # fmt: skip
    return found


def _match(pattern: Pattern, ordered: Sequence[LogText]) -> Diagnosis | None:
    """The first line `pattern` matches in the ordered logs, with its traceback when it ends one."""
    first: tuple[LogText, str] | None = None
    ranks: list[int] = []
    for log in ordered:
        line = next((line for line in _lines(log.text) if pattern.regex.search(line)), None)
        if line is None:
            continue
        first = first or (log, line)
        if log.rank is not None and log.rank not in ranks:
            ranks.append(log.rank)
    if first is None:
        return None
    log, line = first
    traceback = next((tb.text for tb in tracebacks(log) if pattern.regex.search(tb.last_line)), None)
    return Diagnosis(pattern.kind, pattern.title, pattern.cause, pattern.advice, log.rank, line.strip(), ranks,
                     traceback)  # fmt: skip


def root_cause_rank(logs: Sequence[LogText]) -> int | None:
    """The rank torchrun names as the first observed failure in its own output, if it wrote that block."""
    for log in logs:
        if log.rank is None and (found := ROOT_CAUSE.findall(log.text)):
            return int(found[-1])  # the latest launch's, when a resumed run's launcher output holds several
    return None


def _first_failure_first(logs: Sequence[LogText]) -> list[LogText]:
    """Ranks' logs, the root-cause rank first, then by when each file last changed; the launcher's last."""
    root = root_cause_rank(logs)

    def order(log: LogText) -> tuple[int, float, int, int]:
        if log.rank is None:
            return (2, 0.0, 0, 0)
        return (0 if log.rank == root else 1, log.modified, log.rank, 0 if log.stream == "stderr" else 1)

    return sorted(logs, key=order)


def tracebacks(log: LogText) -> list[Traceback]:
    """The Python tracebacks in a log, a chain of exceptions as one, leaving out torchrun's TORCHRUN_REPORTS."""
    lines = _lines(log.text)
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != TRACEBACK_START:
            i += 1
            continue
        end, last = _traceback_end(lines, i)
        if last and not any(report in last for report in TORCHRUN_REPORTS):
            found.append(Traceback("\n".join(lines[i:end][-MAX_TRACEBACK_LINES:]), last.strip()))
        i = end
    return found


def _traceback_end(lines: list[str], start: int) -> tuple[int, str]:
    """Where the traceback starting at `start` ends (exclusive), and its exception line."""
    i, last = start + 1, ""
    while i < len(lines):
        while i < len(lines) and lines[i].startswith((" ", "\t")):
            i += 1  # the frames: indented
        if i >= len(lines) or lines[i].strip() == TRACEBACK_START:
            break  # another process's traceback began in the same file: this one's end is mixed into that one
        last, i = lines[i], i + 1
        while i < len(lines) and lines[i].strip() and not lines[i].startswith(TRACEBACK_START):
            i += 1  # a message of several lines
        if not _chained(lines, i):
            break
        i += 4  # blank, "During handling...", blank, "Traceback ..."
    return i, last


def _chained(lines: list[str], i: int) -> bool:
    """True when another exception of the same chain follows at line `i` (the blank line after a message)."""
    return (
        i + 3 < len(lines)
        and not lines[i].strip()
        and lines[i + 1].startswith(CHAINED)
        and lines[i + 3].strip() == TRACEBACK_START
    )


def _lines(text: str) -> list[str]:
    return [RANK_PREFIX.sub("", line) for line in text.splitlines()]
