"""A run's log files: which there are, their last lines (filtered), what was appended since, and what went wrong.

Logs can be large (a chatty rank writes gigabytes), so nothing here reads a file whole: the tail is read backwards
from the end block by block, a filter gives up after a byte budget and says so, and live reading takes one capped
read from an offset per poll. Files are found only through the run's own folder, never from a path a user gave.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rankboard import wire
from sqlalchemy.orm import object_session

from app.core.errors import FieldInvalid, PathNotFound
from app.core.folders import RunFolders
from app.core.models import Run, RunStatus
from app.launcher.launchers import kind
from app.launcher.local import latest_launch
from app.launcher.slurm import AGENT_LOGS
from app.schemas.logs import DiagnosisOut
from app.services import gpu_health
from app.services.diagnose import LogText, diagnose, root_cause_ranks

STREAMS = ("stdout", "stderr")
LAUNCHER = "launcher"  # the rank segment that names the launcher's own output
BLOCK = 64 * 1024
SCAN_BUDGET = 8 * 1024 * 1024  # what a filtered tail may read before it gives up on finding more matches
READ_LIMIT = 256 * 1024  # one live read; a page that fell behind catches up over several polls
DIAGNOSE_BYTES = 256 * 1024  # the tail of each file that diagnosis looks at
MAX_LINE_CHARS = 10_000  # a line longer than this (a progress bar without newlines) is cut for display
assert 4 * MAX_LINE_CHARS <= BLOCK  # a tail keeps a block of a long line: enough for its shown characters
DOWNLOAD_CHUNK = 256 * 1024
MARKER_BYTES = 4096  # a rank marker is a line of JSON: a bigger file is not one
# Slurm's stepd ends a job's output with this line when it requeues the job: what follows is the next attempt's.
SLURM_REQUEUE = re.compile(r"^.*\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO JOB REQUEUE \*\*\*.*$", re.M)


@dataclass(frozen=True)
class LogFile:
    """One log file of a run. `rank` is the global rank, None for the launcher's output (torchrun's on this host,
    Slurm's output file of the job for a Slurm run)."""

    rank: int | None
    stream: str
    size: int
    modified: float
    attempt: int | None  # torchrun's restart attempt the file belongs to; None for the launcher's
    path: Path
    # No rank marker (a script that does not import rankboard.report) on a run of several agents: the rank is the
    # agent's index times nproc_per_node plus the local rank, which c10d's rendezvous order need not follow.
    rank_guessed: bool = False

    @property
    def rank_name(self) -> str:
        return LAUNCHER if self.rank is None else str(self.rank)


@dataclass(frozen=True)
class Tail:
    """The last lines of a file (those that match the filter), and how far reading went to find them."""

    lines: list[str]
    size: int
    end: int  # just after the last complete line: where live reading goes on
    inode: int
    scanned: int
    budget_hit: bool  # the byte budget ran out before `lines` matching lines were found


@dataclass(frozen=True)
class Chunk:
    """What was appended to a file since an offset, in whole lines."""

    lines: list[str]
    offset: int  # where the next read starts
    size: int
    inode: int
    restarted: bool  # the file was truncated or replaced: reading began again at its start


@dataclass(frozen=True)
class RankFolder:
    """One worker's folder of torchrun's logs, `<attempt>/<local rank>/`, and the global rank it belongs to."""

    path: Path
    rank: int
    attempt: int
    guessed: bool  # see LogFile.rank_guessed


def log_files(run: Run, *, folders: RunFolders) -> list[LogFile]:
    """Each rank's stdout and stderr of its agent's latest attempt, by global rank, then the launcher's own output."""
    root, run_dir = folders.shared, folders.run_dir(run)
    found = []
    for worker in rank_folders(run_dir / "ranks", nproc_per_node=run.nproc_per_node):
        for stream in STREAMS:
            file = _log_file(root, worker.path / f"{stream}.log", worker.rank, stream, worker.attempt, worker.guessed)
            if file is not None:
                found.append(file)
    output = launcher_output(run, folders=folders)
    file = _log_file(root, output, None, "stdout", None) if output is not None else None
    return [*found, file] if file is not None else found


def launcher_output(run: Run, *, folders: RunFolders) -> Path | None:
    """The launcher's own output: Slurm's output file of the run's job, the local launcher's torchrun log; none of a
    run launched elsewhere."""
    return kind(run.launcher).output_file(run, folders)


def rank_folders(ranks_dir: Path, *, nproc_per_node: int) -> list[RankFolder]:
    """Every worker's folder of each agent's latest attempt, in global rank order.

    A Slurm run's agents each write under `ranks/agent<SLURM_PROCID>/`; the local launcher's one agent writes under
    `ranks/` itself. A rank is taken from the marker the worker's client left (wire.RANK_MARKER); without one,
    from the agent's index. Two folders claiming one rank (a marker gone stale): the newer one is shown.
    """
    agents = agent_folders(ranks_dir)
    found: dict[int, RankFolder] = {}
    for index, agent in agents:
        attempt = latest_attempt(agent)
        if attempt is None:
            continue
        number = int(attempt.name.removeprefix("attempt_"))
        for worker in (d for d in attempt.iterdir() if d.name.isdigit() and d.is_dir()):
            marked = marked_rank(worker)
            rank = marked if marked is not None else index * nproc_per_node + int(worker.name)
            folder = RankFolder(worker, rank, number, guessed=marked is None and len(agents) > 1)
            if rank not in found or _newer(folder.path, found[rank].path):
                found[rank] = folder
    return [found[rank] for rank in sorted(found)]


def agent_folders(ranks_dir: Path) -> list[tuple[int, Path]]:
    """Each torchrun agent's --log-dir with its index: `agent<n>` folders (Slurm), else `ranks/` itself."""
    agents = []
    for path in ranks_dir.glob(f"{AGENT_LOGS}*"):
        number = path.name.removeprefix(AGENT_LOGS)
        if number.isascii() and number.isdigit() and path.is_dir():
            agents.append((int(number), path))
    return sorted(agents) if agents else [(0, ranks_dir)]


def marked_rank(worker: Path) -> int | None:
    """The global rank in the marker the worker's client left in its folder; None without a sound one."""
    marker = worker / wire.RANK_MARKER
    try:
        if not marker.is_file():  # never open a FIFO or a device someone put there
            return None
        with open(marker, "rb") as f:
            rank = json.loads(f.read(MARKER_BYTES)).get("rank")
    except (OSError, ValueError, AttributeError):
        return None
    return rank if type(rank) is int and 0 <= rank < 1_000_000 else None


def _newer(path: Path, than: Path) -> bool:
    try:
        return path.stat().st_mtime > than.stat().st_mtime
    except OSError:
        return False


def latest_attempt(ranks_dir: Path) -> Path | None:
    """torchrun's folder of its latest attempt: `<ranks>/<rdzv id>_<random>/attempt_<n>` (one per restart)."""
    attempts = [p for p in ranks_dir.glob("*/attempt_*") if p.name.removeprefix("attempt_").isdigit()]
    if not attempts:
        return None
    return max(attempts, key=lambda p: (p.stat().st_mtime, int(p.name.removeprefix("attempt_"))))


def _log_file(
    root: Path, path: Path, rank: int | None, stream: str, attempt: int | None, guessed: bool = False
) -> LogFile | None:
    """The file as a LogFile when it is a regular file inside the shared folder; links that leave it are ignored."""
    if not path.resolve().is_relative_to(root.resolve()):
        return None
    try:
        stat = path.stat()
    except OSError:
        return None
    if not path.is_file():
        return None
    return LogFile(rank, stream, stat.st_size, stat.st_mtime, attempt, path, guessed)


def parse_rank(rank: str) -> int | None:
    """A rank as the URL gives it: a number, or `launcher` (None)."""
    if rank == LAUNCHER:
        return None
    if not rank.isascii() or not rank.isdigit() or len(rank) > 6:
        raise FieldInvalid("rank", f"rank must be a rank number or {LAUNCHER!r}, not {rank!r}")
    return int(rank)


def check_stream(stream: str) -> str:
    if stream not in STREAMS:
        raise FieldInvalid("stream", f"stream must be one of {', '.join(STREAMS)}, not {stream!r}")
    return stream


def find_log(run: Run, *, folders: RunFolders, rank: int | None, stream: str) -> LogFile | None:
    """The file of that rank and stream, or None while there is none (yet)."""
    return next((f for f in log_files(run, folders=folders) if f.rank == rank and f.stream == stream), None)


def log_file(run: Run, *, folders: RunFolders, rank: str, stream: str) -> LogFile:
    """The file a URL names; 422 for a malformed rank or stream, 404 naming the rank when the run has none."""
    number, stream = parse_rank(rank), check_stream(stream)
    file = find_log(run, folders=folders, rank=number, stream=stream)
    if file is not None:
        return file
    if number is None and stream == "stderr":
        raise PathNotFound("the launcher's stdout and stderr are one file: ask for launcher/stdout")
    if number is None:
        raise PathNotFound(f"run {run.id} has no launcher output yet")
    ranks = sorted({f.rank for f in log_files(run, folders=folders) if f.rank is not None})
    known = f"its ranks: {', '.join(map(str, ranks))}" if ranks else "it has no rank logs yet"
    raise PathNotFound(f"run {run.id} has no {stream} log for rank {number} ({known})")


def tail_log(run: Run, *, folders: RunFolders, rank: str, stream: str, lines: int, filter: str = "") -> Tail:
    """The last `lines` lines (matching `filter`) of one of the run's logs."""
    return tail(log_file(run, folders=folders, rank=rank, stream=stream).path, lines, filter)


def matches(line: str, filter: str) -> bool:
    """The filter: a case-insensitive substring; an empty one matches everything."""
    return not filter or filter.casefold() in line.casefold()


def tail(path: Path, lines: int, filter: str = "", *, budget: int = SCAN_BUDGET, partial: bool = True) -> Tail:
    """The last `lines` lines of `path` that match `filter`, read backwards from the end a block at a time.

    At most `budget` bytes are read; a 1 GB file costs only the blocks read. `partial` includes a last line that
    has no newline yet (a live reader leaves it out and gets it whole later).
    """
    found: list[str] = []
    with open(path, "rb") as f:
        stat = os.fstat(f.fileno())
        pos, carry, scanned, end = stat.st_size, b"", 0, None
        while pos > 0 and len(found) < lines and scanned < budget:
            start = max(0, pos - BLOCK)
            f.seek(start)
            block = f.read(pos - start)
            scanned, pos = scanned + len(block), start
            data = block + carry
            pieces = data.split(b"\n")
            # The first piece's start lies in the block before. Only the beginning of a line is shown, so of a
            # line longer than a block only its first bytes are kept: reading never copies more than two blocks.
            carry = pieces.pop(0)[:BLOCK] if pos > 0 else b""
            if end is None and pieces:
                end = start + block.rfind(b"\n") + 1  # after it, a line still being written (carry has no newline)
                if not partial or not pieces[-1]:
                    pieces.pop()
            if not _may_match(data, filter):
                continue
            for raw in reversed(pieces):
                text = _text(raw)
                if matches(text, filter):
                    found.append(text)
                    if len(found) == lines:
                        break
    budget_hit = scanned >= budget and pos > 0 and len(found) < lines
    end = stat.st_size if end is None else end
    return Tail(found[::-1], stat.st_size, end, stat.st_ino, scanned, budget_hit)


def _may_match(data: bytes, filter: str) -> bool:
    """False when no line of `data` can match: a quick test in C for the usual ASCII log and filter, which saves
    decoding every line of blocks without a match (30 times faster for a filter that finds nothing)."""
    if not filter or not filter.isascii() or not data.isascii():
        return True  # beyond ASCII, case folding can change lengths ("ß" is "ss"): leave it to `matches`
    return filter.lower().encode() in data.lower()


def read_from(
    path: Path, offset: int, *, inode: int | None = None, limit: int = READ_LIMIT, final: bool = False
) -> Chunk:
    """Whole lines appended since `offset`, at most `limit` bytes of them, cut at the last newline.

    A file now shorter than `offset` (truncated) or another file under the same name (rotated) is read again from
    its start. `final`: the writer is gone, so a last line without a newline is complete.
    """
    with open(path, "rb") as f:
        stat = os.fstat(f.fileno())
        restarted = offset > stat.st_size or (inode is not None and inode != stat.st_ino)
        offset = 0 if restarted else offset
        f.seek(offset)
        data = f.read(min(limit, stat.st_size - offset))
    cut = data.rfind(b"\n") + 1
    if final or (cut == 0 and len(data) >= limit):  # a line longer than a read must not stall the reader
        cut = len(data)
    text = [_text(raw) for raw in data[:cut].split(b"\n")]
    if text and not text[-1]:
        text.pop()
    return Chunk(text, offset + cut, stat.st_size, stat.st_ino, restarted)


def _text(raw: bytes) -> str:
    text = raw.removesuffix(b"\r").decode("utf-8", errors="replace")
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "…"


def download(file: LogFile) -> Iterator[bytes]:
    """The file in chunks, up to the size it had when listed (that is the Content-Length promised)."""
    left = file.size
    with open(file.path, "rb") as f:
        while left > 0 and (chunk := f.read(min(DOWNLOAD_CHUNK, left))):
            left -= len(chunk)
            yield chunk


SLURM_CANCELLED = "slurm_cancelled"  # the diagnosis kind of a job cancelled with scancel


def diagnoses(run: Run, *, folders: RunFolders) -> list[DiagnosisOut]:
    """Known failures found in the tails of the run's logs (bounded: DIAGNOSE_BYTES of each file)."""
    texts = [LogText(f.rank, f.stream, _tail_text(f.path), f.modified) for f in log_files(run, folders=folders)]
    found = diagnose([_latest_launch(t) if t.rank is None else t for t in texts])
    # A run stopped on request ends with Rankboard's own scancel: that is no failure to explain.
    found = [d for d in found if not (run.stop_requested_at and d.kind == SLURM_CANCELLED)]
    db = object_session(run)  # the caller's: a GPU that failed under the run explains it before its logs do
    gpus = [] if db is None else gpu_health.diagnoses(db, run=run)
    slowed = [d for d in gpus if d.kind == gpu_health.SLOWDOWN_KIND]  # a slow GPU explains no crash: after the logs
    return [d for d in gpus if d not in slowed] + found + slowed


def opening_log(run: Run, *, folders: RunFolders, found: Sequence[DiagnosisOut]) -> tuple[str, str]:
    """The log (rank as a URL names it, and stream) the panel opens on: where the first failure was seen; for a
    failed run with none recognised, the stderr of the rank torchrun names as its root cause; else rank 0's stdout."""
    if found:
        first = found[0]
        return (LAUNCHER if first.log_rank is None else str(first.log_rank)), first.stream
    output = launcher_output(run, folders=folders)
    if run.status in (RunStatus.failed, RunStatus.lost) and output is not None:
        roots = root_cause_ranks([_latest_launch(LogText(None, "stdout", _tail_text(output)))])
        if roots:
            return str(min(roots)), "stderr"  # killed without a word (SIGKILL, a segfault): its stderr says most
    return "0", "stdout"


def _latest_launch(log: LogText) -> LogText:
    """The launcher's output of the latest launch only (a resumed local run, a job Slurm requeued)."""
    text = latest_launch(log.text)
    requeues = list(SLURM_REQUEUE.finditer(text))
    return LogText(log.rank, log.stream, text[requeues[-1].end() :] if requeues else text, log.modified)


def _tail_text(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - DIAGNOSE_BYTES))
            data = f.read(DIAGNOSE_BYTES)
    except OSError:
        return ""
    if size > DIAGNOSE_BYTES:
        data = data.partition(b"\n")[2]  # the first line read is probably cut
    return data.decode("utf-8", errors="replace")


@dataclass
class LogFollower:
    """One page's live view of one log: its tail first, then what is appended, poll by poll."""

    rank: int | None
    stream: str
    filter: str = ""
    lines: int = 200
    path: Path | None = None
    offset: int = 0
    inode: int | None = None


@dataclass(frozen=True)
class LogUpdate:
    """What a poll found: `reset` means show `lines` instead of what is shown (a first tail, or a new file)."""

    lines: list[str]
    reset: bool = False
    budget_hit: bool = False
    done: bool = False  # the run is over and everything was read


def follow(follower: LogFollower, run: Run, *, folders: RunFolders) -> LogUpdate:
    """One poll: one stat and at most one capped read, so a page open for hours costs little."""
    final = run.status.is_final
    file = find_log(run, folders=folders, rank=follower.rank, stream=follower.stream)
    if file is None:
        return LogUpdate([], done=final)
    if file.path != follower.path:  # the first poll, or a restart began a new attempt's files
        found = tail(file.path, follower.lines, follower.filter, partial=False)
        follower.path, follower.offset, follower.inode = file.path, found.end, found.inode
        return LogUpdate(found.lines, reset=True, budget_hit=found.budget_hit)
    chunk = read_from(file.path, follower.offset, inode=follower.inode, final=final)
    follower.offset, follower.inode = chunk.offset, chunk.inode
    lines = [line for line in chunk.lines if matches(line, follower.filter)]
    return LogUpdate(lines, reset=chunk.restarted, done=final and chunk.offset >= chunk.size)
