"""Failures explained: known causes recognised in the ranks' logs and the launcher's (Slurm's), with what to do.

The wording follows the troubleshooting table of the DDP checklist. Only text is looked at here (the service reads
the bounded tails of the files); nothing is guessed from the exit code alone. Lines are read as each process wrote
them: the prefixes torch, torchrun --tee and srun --label put before them are stripped, and a file several processes
wrote is split by them (PREFIXES). When several ranks fail, the first one to fail is the one worth reading, and is
listed first: a rank that only lost a peer ("Connection closed by peer") failed because another did; torchrun names
the first failure it observed in its "Root Cause (first observed failure)" block (to the second, so a rank that
died a moment later can share it); and the rank whose log stopped changing first is taken before the others.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from app.schemas.logs import DiagnosisOut


@dataclass(frozen=True)
class LogText:
    """The tail of one log file: `rank` is None for the launcher's own output (torchrun's agent)."""

    rank: int | None
    stream: str
    text: str
    modified: float = 0.0


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
    # What a rank says when another one died under it: gloo's pair.cc ("Connection closed by peer [addr]:port. This is
    # typically caused by a remote worker crashing."), the TCPStore's client, NCCL's ncclRemoteError.
    Pattern(
        "peer_lost", "Lost a peer: another rank stopped first",
        re.compile(r"Connection (?:closed|reset) by (?:remote )?peer|remote worker crashing|"
                   r"Failed to recv, got 0 bytes|remote process exited or there was a network error", re.IGNORECASE),
        "This rank's collective (or its talk with the rendezvous store) failed because the rank at the other end "
        "went away: it died first, or its node or the network between them failed. It is a consequence, not the "
        "cause.",
        "Read the failure of the rank that stopped first, listed above; when every rank says only this, suspect "
        "the network or a node that went down.",
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
# The prefixes written before a process's lines, outermost first. Each is stripped exactly, its space included, so
# that a traceback's frames keep their indentation and its exception line has none:
# - srun --label's task number, "%*d: " padded to the widest task's ("P<n> " before it in a heterogeneous job); at
#   most 4 wide (9999 tasks), so that a traceback's source line, indented by 4, such as "    10: 'ten'," is no label;
# - torchrun --tee's "[<role><local rank>]:", no space ("[default1]:"; TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE may
#   make it "[<rank>]:");
# - torch's own "[rank<n>]: ", which the excepthook init_process_group installs writes before every non-blank line
#   of an uncaught exception's traceback (and "[rank<n>]:", no space, before c10d's C++ warnings).
PREFIXES = (
    re.compile(r"((?:P\d+ )?(?=[ \d]{1,4}: ) *\d+): "),
    re.compile(r"\[((?!rank\d)[\w.-]*\d+)\]:"),
    re.compile(r"\[rank(\d+)\]: ?"),
)
NO_PREFIX = ("", "", "")
ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?\n\s*time\s*:\s*(\S+).*?\n\s*rank\s*:\s*(\d+)", re.DOTALL
)
MAX_TRACEBACK_LINES = 80
# torchrun's own tracebacks that are reports, not errors: a rank failed (its own traceback is the one to read), or
# torchrun was signalled (a stop asked for).
TORCHRUN_REPORTS = ("ChildFailedError", "SignalException")
# Failures that follow from another rank's: a rank that shows only these failed after one that shows something else.
CONSEQUENCES = [p for p in PATTERNS if p.kind in ("peer_lost", "nccl_timeout")]
# The scheduler's verdict comes first: what the ranks and torchrun wrote as Slurm ended the job follows from it.
SCHEDULER_KINDS = {p.kind for p in PATTERNS if p.kind.startswith("slurm_")}


@dataclass(frozen=True)
class Traceback:
    text: str
    last_line: str  # the exception itself: `ValueError: ...`


@dataclass(frozen=True)
class Output:
    """What one process wrote to a log, its prefixes stripped: all of a rank's own file, or a share of a file
    several processes wrote (torchrun's --tee copy, Slurm's output of several agents)."""

    log: LogText
    rank: int | None  # the rank torch's "[rank<n>]:" names, else the log's
    lines: list[str]
    last: int  # where its last line is in the file: of the processes that wrote to one file, who stopped first
    tracebacks: list[Traceback]


def diagnose(logs: Sequence[LogText]) -> list[DiagnosisOut]:
    """Every known failure found in `logs`: Slurm's first, then by the rank that failed first."""
    ordered = _first_failure_first(_outputs_of(logs), root_cause_ranks(logs))
    found = [match for pattern in PATTERNS if (match := _match(pattern, ordered)) is not None]
    exception = _exception(ordered)
    found += [exception] if exception is not None else []
    found.sort(key=lambda match: (match[1].kind not in SCHEDULER_KINDS, match[0]))
    return [diagnosis for _, diagnosis in found]


def _match(pattern: Pattern, ordered: Sequence[Output]) -> tuple[int, DiagnosisOut] | None:
    """The first line `pattern` matches in the ordered outputs (with its traceback when it ends one), and where."""
    hits = []
    for i, output in enumerate(ordered):
        line = next((line for line in output.lines if pattern.regex.search(line)), None)
        if line is not None:
            hits.append((i, output, line))
    if not hits:
        return None
    i, output, line = hits[0]
    ranks = list(dict.fromkeys(o.rank for _, o, _ in hits if o.rank is not None))
    traceback = next((tb.text for tb in output.tracebacks if pattern.regex.search(tb.last_line)), None)
    return i, _diagnosis(pattern.kind, pattern.title, pattern.cause, pattern.advice, output, line.strip(), ranks,
                         traceback)  # fmt: skip


def _exception(ordered: Sequence[Output]) -> tuple[int, DiagnosisOut] | None:
    """The last traceback of the output that failed first, unless a pattern explains it; an earlier one in the same
    output was survived."""
    first = next(((i, output) for i, output in enumerate(ordered) if output.tracebacks), None)
    if first is None:
        return None
    i, output = first
    tb = output.tracebacks[-1]
    line = tb.last_line
    if any(pattern.regex.search(line) for pattern in PATTERNS):
        return None
    # Every rank that died of the same error (a bug on every rank), in the order they failed.
    ended = (o.rank for o in ordered if o.rank is not None and o.tracebacks and o.tracebacks[-1].last_line == line)
    title = f"Python exception: {line.split(':', 1)[0]}"
    return i, _diagnosis("exception", title, EXCEPTION_CAUSE, EXCEPTION_ADVICE, output, line,
                         list(dict.fromkeys(ended)), tb.text)  # fmt: skip


def _diagnosis(
    kind: str, title: str, cause: str, advice: str, output: Output, line: str, ranks: list[int], tb: str | None
) -> DiagnosisOut:
    return DiagnosisOut(kind=kind, title=title, cause=cause, advice=advice, rank=output.rank, line=line, ranks=ranks,
                        traceback=tb, log_rank=output.log.rank, stream=output.log.stream)  # fmt: skip


def root_cause_ranks(logs: Sequence[LogText]) -> set[int]:
    """The ranks torchrun names as the first observed failure in its own output. Each agent names one of its own,
    so those named at the earliest time are kept (to the second: a tie keeps several)."""
    named = [
        found
        for log in logs
        if log.rank is None
        for output in outputs(log)
        for found in ROOT_CAUSE.findall("\n".join(output.lines))
    ]
    earliest = min((time for time, _ in named), default=None)
    return {int(rank) for time, rank in named if time == earliest}


def _first_failure_first(found: Sequence[Output], roots: set[int]) -> list[Output]:
    """Outputs in the order their processes failed: those that only lost a peer after all others, and the
    launcher's own after the ranks'; then the ranks torchrun named as the root cause first; then by when each file
    last changed, and by where each process's last line is in a file that several wrote."""

    def order(output: Output) -> tuple[bool, bool, bool, float, int, int, bool]:
        rank = -1 if output.rank is None else output.rank
        return (_consequential(output), output.rank is None, output.rank not in roots, output.log.modified,
                output.last, rank, output.log.stream != "stderr")  # fmt: skip

    return sorted(found, key=order)


def _consequential(output: Output) -> bool:
    """True when what the output shows failing is a consequence of another rank's failure (see CONSEQUENCES)."""
    lines = [output.tracebacks[-1].last_line] if output.tracebacks else output.lines
    return any(pattern.regex.search(line) for pattern in CONSEQUENCES for line in lines)


def _outputs_of(logs: Sequence[LogText]) -> list[Output]:
    """Every process's output; of the launcher's, only what ranks without a log of their own wrote (a --tee copy
    of a rank's log would name its failure twice)."""
    own = {log.rank for log in logs if log.rank is not None}
    return [output for log in logs for output in outputs(log) if log.rank is not None or output.rank not in own]


def outputs(log: LogText) -> list[Output]:
    """The log split by the process that wrote each line, as the lines' prefixes (PREFIXES) tell them apart."""
    groups: dict[tuple[str, ...], list[str]] = {}
    last: dict[tuple[str, ...], int] = {}
    key: tuple[str, ...] = NO_PREFIX
    for i, line in enumerate(log.text.splitlines()):
        text, found = _strip(line)
        # torch leaves blank lines (a chain's separators) without its prefix: they belong with the lines around them.
        if text or any(name and name != was for name, was in zip(found, key, strict=True)):
            key = found
        groups.setdefault(key, []).append(text)
        last[key] = i
    return [
        Output(log, int(key[2]) if key[2] else log.rank, lines, last[key], tracebacks(lines))
        for key, lines in groups.items()
    ]


def _strip(line: str) -> tuple[str, tuple[str, ...]]:
    """The line without its prefixes, and the writer each named ("" for a prefix it does not have)."""
    names = []
    for prefix in PREFIXES:
        match = prefix.match(line)
        names.append(match.group(1) if match else "")
        line = line[match.end() :] if match else line
    return line, tuple(names)


def tracebacks(lines: list[str]) -> list[Traceback]:
    """The Python tracebacks in one process's lines, a chain of exceptions as one, leaving out torchrun's
    TORCHRUN_REPORTS."""
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
