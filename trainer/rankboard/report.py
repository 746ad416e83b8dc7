"""Sends a run's metrics to the Rankboard server from a background thread, so training never waits on the network.

    from rankboard import report
    report.log({"loss": loss.item()}, step=step)
    report.log({"train": {"loss": loss, "acc": acc}})  # train/loss, train/acc; at the step after the last (see log())
    report.progress(step=step, total_steps=5120)  # or a whole wire.Progress(epoch=1, epochs=10, step=..., ...)
    report.heartbeat(step)  # on every rank: "alive at this step", sent every couple of seconds
    report.finished()  # once training completed: the dashboard then trusts that over torchrun's exit code
    report.close()  # also runs at exit

The reporter is made from the launcher's environment on the first call; outside a dashboard run (no
RANKBOARD_RUN_ID) every call does nothing, unless the script was launched elsewhere (its own sbatch, torchrun or
Kubernetes job) and said where to report, on every rank:

    report.init(server="http://dash:8000", name="llama-ft", config={"lr": 3e-4})  # or RANKBOARD_URL, RANKBOARD_TOKEN

All processes of that job then report into one run (see `rankboard.external` for how they find it). Import the client
as `rankboard.report` (the same module, installed under a second name) where a `trainer.py` of the user's own
would shadow this package. When the server cannot be reached, batches go to a spool file in the run
folder and are sent, in order, once it answers again, also by a restarted trainer. The server stores a point once
per (run, key, step, rank), so sending one twice is harmless, and this client prefers that to losing one. A run
launched elsewhere with RANKBOARD_MODE=offline never touches the network: it is written to a folder, which
`rankboard sync` uploads later, as it does what an online run's server never took (rankboard.offline).

One batch never holds back the others. A batch the server refuses (a 4xx: a value it cannot take) is dropped, with one
line on stderr, and never sent again; what the client can mend before sending (a rate that is infinite, a step that
is a numpy integer) it mends, and says so once. A batch the server fails on (a 500) while it takes the batch after it
is set aside in a file beside the spool (`SetAside`) and tried again later; a server failing on every batch, or away,
keeps them all in the spool, in order.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import enum
import hashlib
import http.client
import json
import math
import operator
import os
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlsplit

from . import external, forensics, offline, relay, wire
from .offline import RankFiles  # by name: Reporter's `offline` argument hides the module there

_REQUEST_TIMEOUT_S = 5.0
_RETRY_FIRST_S = 1.0
_RETRY_MAX_S = 5.0
# A batch the server fails on while it takes the others (SetAside) is retried after 2, 4, 8, ... 60 s, while the server
# takes the rest; failed this many times, a minute or two of a working server refusing it, it is dropped.
ASIDE_TRIES = 6
_ASIDE_FIRST_S = 2.0
_ASIDE_MAX_S = 60.0
# How often each rank posts, from its environment: Rankboard's launchers pass on the server's, a job launched elsewhere
# has its own. Pages read once a second. Longer costs the server less CPU (on a node that trains too, CPU that training
# then keeps; bench/post_cost.py), and puts the charts that much behind. At most 10 s: a rank's heartbeat rides on its
# posts, and the server's stall check (RANKBOARD_STALL_AFTER_S, 60 s by default) must see several.
ENV_REPORT_S = "RANKBOARD_REPORT_S"
DEFAULT_REPORT_S = 1.0
REPORT_S_RANGE = (0.25, 10.0)
HEARTBEAT_S = 2.0  # a rank with nothing to post says it is alive this often, or at each post if they are further apart

# What log() queues: (key, step, value, unix time, rank or None for the reporter's own). A tuple, because log() must
# cost well under 5 microseconds.
_Raw = tuple[str, int, float, float, int | None]


class Outcome(enum.Enum):
    """What became of one POST, and so of the batch it carried."""

    ACCEPTED = "accepted"
    # No answer, or one saying the server is away or busy (_AWAY): keep the batch, and those behind it, for later.
    RETRY = "retry"
    # Any other 5xx, an error of the server's own: kept like RETRY, but it may be this batch's alone, which the batch
    # after it tells (Spool.replay).
    SERVER_ERROR = "server error"
    REJECTED = "rejected"  # any other 4xx: this batch can never be accepted, so it is dropped, never sent again
    RUN_OVER = "run over"  # 409: the run has ended and the server takes nothing more from it

    @property
    def keeps(self) -> bool:
        """Whether the batch is kept, to be sent again."""
        return self is Outcome.RETRY or self is Outcome.SERVER_ERROR


# 408 and 429 ask for the request again later; 502, 503 and 504 come from a proxy, or a server starting or stopping,
# whatever the batch: all say "not now", never "not this batch".
_AWAY = frozenset({408, 429, 502, 503, 504})


def outcome_of(status: int | None) -> Outcome:
    """Classify an HTTP status; None means no response at all."""
    if status is None or status in _AWAY or not 200 <= status < 600 or 300 <= status < 400:
        return Outcome.RETRY  # a redirect too: a wrong URL is mended and the spool sent, never the batch dropped
    if status >= 500:
        return Outcome.SERVER_ERROR
    if status < 300:
        return Outcome.ACCEPTED
    return Outcome.RUN_OVER if status == 409 else Outcome.REJECTED


def checked_url(url: str) -> str:
    """The server's URL; raises ValueError unless it looks like http(s)://host[:port][/path]."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"server URL must look like http://host:port, got {url!r}")
    return url


class IngestConnection:
    """One kept-alive HTTP connection to the server's ingest endpoint, reopened after any failure."""

    def __init__(self, url: str, run_id: str, token: str, timeout: float = _REQUEST_TIMEOUT_S) -> None:
        parts = urlsplit(checked_url(url))
        assert parts.hostname is not None  # checked
        self._https = parts.scheme == "https"
        self._host, self._port, self._timeout = parts.hostname, parts.port, timeout
        self._base, self._run_id = parts.path.rstrip("/"), quote(str(run_id), safe="")
        self._path = self._base + wire.INGEST_PATH.format(run_id=self._run_id)
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self._connection: http.client.HTTPConnection | None = None

    def post(self, body: bytes, path: str | None = None) -> tuple[int | None, str, bytes]:
        """POST one batch (or, to `path`, anything else); returns the HTTP status (None if no response came), a line
        describing it, and the reply."""
        reused, path = self._connection is not None, path or self._path
        try:
            return self._post_once(body, path)
        except (OSError, http.client.HTTPException) as error:
            self.close()
            # A kept-alive connection that the server closed while idle fails on first use: that alone does not
            # mean the server is down, so try once more on a fresh one. A timeout is not retried: it would double.
            if not (reused and isinstance(error, ConnectionError)):
                return None, f"{type(error).__name__}: {error}", b""
        try:
            return self._post_once(body, path)
        except (OSError, http.client.HTTPException) as error:
            self.close()
            return None, f"{type(error).__name__}: {error}", b""

    def dump_path(self, request: int) -> str:
        """Where this run's rank dumps for one request go."""
        return self._base + wire.DUMP_PATH.format(run_id=self._run_id, request=request)

    def _post_once(self, body: bytes, path: str) -> tuple[int | None, str, bytes]:
        if self._connection is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._connection = kind(self._host, self._port, timeout=self._timeout)
        self._connection.request("POST", path, body=body, headers=self._headers)
        response = self._connection.getresponse()
        text = response.read()  # read to the end, or the connection cannot carry the next request
        return response.status, f"HTTP {response.status}: {text[:200].decode(errors='replace')}", text

    def close(self) -> None:
        """Drop the connection; the next post opens a new one."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class Spool:
    """Batches the server has not accepted yet, one JSON line each, oldest first.

    A file rather than memory, so that a trainer restarted after a crash sends what its previous process could not.
    Only the reporter's thread reads and writes it.
    """

    def __init__(self, path: Path, warn: Callable[[str, str], None]) -> None:
        self.path = path
        self._warn = warn
        self._accepted_bytes = 0  # the start of the file that the server has already accepted
        self.pending = path.exists()
        # The spool holds one batch, which the server failed on with an error of its own: the next batch, sent
        # straight away, tells whether that one batch or the server is at fault.
        self.lone_failure = False
        if self.pending:
            _end_torn_line(path)

    def append(self, line: bytes, *, failed: bool = False) -> None:
        """Add a batch after all the others; `failed`: the server just failed on it with an error of its own."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as file:
            file.write(line + b"\n")
            file.flush()
        self.lone_failure = failed and not self.pending
        self.pending = True

    def replay(self, send: Callable[[bytes], Outcome], set_aside: Callable[[bytes], None]) -> Outcome:
        """Send the batches not yet accepted, in order; stop at the first the server cannot take now. One the server
        fails on with an error of its own while it takes the batch after it goes to `set_aside` instead."""
        self.lone_failure = False
        try:
            with self.path.open("rb") as file:
                file.seek(self._accepted_bytes)
                outcome = self._send_lines(file, send, set_aside)
            if outcome is not Outcome.ACCEPTED:
                return outcome
            self.path.unlink()
        except FileNotFoundError:
            self._warn("spool gone", f"the spool {self.path} was deleted by someone else; its batches are lost")
        self._accepted_bytes, self.pending = 0, False
        return Outcome.ACCEPTED

    def _send_lines(
        self, file: BinaryIO, send: Callable[[bytes], Outcome], set_aside: Callable[[bytes], None]
    ) -> Outcome:
        # A 500 on the oldest batch alone says little: the server may be failing on everything (its database gone),
        # which the next batch shows by failing too, and then all wait, in order. If the server takes the next one,
        # the oldest is what it cannot take, and holding the rest back behind it would silence the rank.
        failed: bytes | None = None
        for line in file:
            if not self._is_batch(line):
                if failed is None:
                    self._accepted_bytes = file.tell()
                continue
            outcome = send(line.rstrip(b"\n"))
            if outcome is Outcome.SERVER_ERROR and failed is None:
                failed = line
                continue
            if outcome.keeps or outcome is Outcome.RUN_OVER:
                return outcome
            if failed is not None:
                set_aside(failed.rstrip(b"\n"))
                failed = None
            self._accepted_bytes = file.tell()
        self.lone_failure = failed is not None
        return Outcome.SERVER_ERROR if failed else Outcome.ACCEPTED

    def set_aside_rest(self, set_aside: Callable[[bytes], None]) -> None:
        """Hand every batch not yet accepted to `set_aside`, and empty the spool."""
        try:
            with self.path.open("rb") as file:
                file.seek(self._accepted_bytes)
                for line in file:
                    if self._is_batch(line):
                        set_aside(line.rstrip(b"\n"))
            self.path.unlink()
        except FileNotFoundError:
            self._warn("spool gone", f"the spool {self.path} was deleted by someone else; its batches are lost")
        self._accepted_bytes, self.pending, self.lone_failure = 0, False, False

    def _is_batch(self, line: bytes) -> bool:
        return _is_batch(line, self.path, self._warn)


class SetAside:
    """Batches the server failed on with an error of its own (a 500) while it took the batch after each: most likely
    that batch's fault, not the server's, so they wait here instead of holding back every batch behind them.

    Retried now and then, with a growing pause; one that fails ASIDE_TRIES times is dropped. Those tries count only
    while the server takes the rest (the spool empty), never while it is down. A file beside the spool, so that a
    restarted trainer retries them (counting afresh), named like one, so that the server also stores what a run's
    last process left in it when the run ends.
    """

    def __init__(self, path: Path, warn: Callable[[str, str], None]) -> None:
        self.path = path
        self._warn = warn
        self.pending = path.exists()
        self._tries: list[int] = []  # per line of the file, as far as this process has tried them
        self._due, self._pause = 0.0, _ASIDE_FIRST_S  # time.monotonic() of the next retry
        if self.pending:
            _end_torn_line(path)

    def due(self) -> bool:
        """Whether it holds batches whose next try is due."""
        return self.pending and time.monotonic() >= self._due

    def add(self, line: bytes) -> None:
        """Set a batch aside, after those already there; its first retry comes after the pause in progress."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as file:
            file.write(line + b"\n")
        if not self.pending:
            self._due, self._pause = time.monotonic() + _ASIDE_FIRST_S, _ASIDE_FIRST_S
        self.pending = True

    def retry(self, send: Callable[[bytes], Outcome], *, counted: bool = True) -> None:
        """Send each batch once, in order, and keep those that fail again; a try counts only if `counted` and the
        server answered with its error (not while it is away), and a batch out of tries is dropped."""
        kept: list[tuple[bytes, int]] = []
        away = False
        for index, line in enumerate(self._lines()):
            tries = self._tries[index] if index < len(self._tries) else 0
            outcome = Outcome.RETRY if away else send(line)
            away = away or outcome in (Outcome.RETRY, Outcome.RUN_OVER)  # the rest waits for the next round
            if outcome in (Outcome.ACCEPTED, Outcome.REJECTED):
                continue  # taken, or refused for good (said by the reporter)
            if counted and outcome is Outcome.SERVER_ERROR:
                tries += 1
            if tries < ASIDE_TRIES:
                kept.append((line, tries))
            else:
                self._warn("aside dropped", f"dropped a batch the server failed on {tries} times while it took the "
                                            f"others (its points are lost); it was kept in {self.path}")  # fmt: skip
        self._keep(kept)

    def _lines(self) -> list[bytes]:
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        return [line for line in lines if _is_batch(line, self.path, self._warn)]

    def _keep(self, kept: list[tuple[bytes, int]]) -> None:
        self._tries = [tries for _, tries in kept]
        self._pause = min(2 * self._pause, _ASIDE_MAX_S) if kept else _ASIDE_FIRST_S
        self._due, self.pending = time.monotonic() + self._pause, bool(kept)
        if not kept:
            self.path.unlink(missing_ok=True)
            return
        # Whole or not at all: a crash while rewriting must not lose the batches, nor leave half of one.
        with tempfile.NamedTemporaryFile(
            "wb", dir=self.path.parent, prefix=f".{self.path.name}.", delete=False
        ) as file:
            file.write(b"".join(line + b"\n" for line, _ in kept))
        os.replace(file.name, self.path)


def _is_batch(line: bytes, path: Path, warn: Callable[[str, str], None]) -> bool:
    try:
        json.loads(line)
    except ValueError:
        warn("torn line", f"skipped a line of {path} that is not JSON (a crash while writing it)")
        return False
    return True


def _end_torn_line(path: Path) -> None:
    # A crash mid-write leaves a line without its newline; the next append must not be glued onto it.
    with path.open("rb+") as file:
        if file.seek(0, os.SEEK_END) == 0:
            return
        file.seek(-1, os.SEEK_END)
        if file.read(1) != b"\n":
            file.write(b"\n")


@dataclasses.dataclass(frozen=True)
class _SetProgress:
    """A progress as the script set it (Reporter.progress).

    One given whole (a `wire.Progress`: the built-in trainer's) rides on every batch, the trainer's heartbeat as
    `wire.Progress` says. One made from fields (a script's `progress(step=..., total_steps=...)`, or init's total)
    rides only when it changed: repeated by the reporter's thread while the script hangs, it would say that it
    moves. `follows_log`: its step is the last one logged, not its own."""

    progress: wire.Progress
    follows_log: bool = False
    whole: bool = False


class Reporter:
    """Queues metrics in memory and sends them from a daemon thread; log() never blocks and never raises."""

    def __init__(
        self,
        url: str,
        run_id: str | None,
        token: str,
        spool_dir: str | os.PathLike[str],
        rank: int = 0,
        flush_interval: float = DEFAULT_REPORT_S,
        heartbeat_interval: float = HEARTBEAT_S,
        max_batch: int = wire.MAX_POINTS_PER_BATCH,
        *,
        start: bool = True,
        join: wire.Join | None = None,
        offline: bool = False,
        relay_spot: relay.Spot | None = None,
    ) -> None:
        """`run_id` None: a run launched elsewhere, which the thread joins with `join` and `token` (the user's API
        token) before its first post. `offline`: it never posts, every batch goes to the spool, which with the join
        request and this process's ending is what `rankboard sync` uploads (rankboard.offline). `relay_spot`: its
        node's relay (rankboard.relay), which local rank 0 runs and the others post through."""
        if not 1 <= max_batch <= wire.MAX_POINTS_PER_BATCH:
            raise ValueError(f"max_batch must be in 1..{wire.MAX_POINTS_PER_BATCH}, got {max_batch}")
        self._rank, self._flush_interval, self._max_batch = rank, flush_interval, max_batch
        self._heartbeat_interval = heartbeat_interval
        self._points: deque[_Raw] = deque()
        # The step the last log() used, and the counter behind a log() that names none (see log()).
        self._step: object = -1
        self._counted = 0
        self._progress: _SetProgress | None = None
        self._total_steps = 0  # declared by init() or progress(): 0, none
        self._delivered_progress: wire.Progress | None = None  # the last progress sent or spooled
        # The node's inventory (from rankboard.gpu) and this rank's heartbeat ride on a later batch, each once.
        self._host = wire.node_name(os.environ, socket.gethostname())
        self._node: wire.Node | None = None
        self._delivered_node: wire.Node | None = None
        self._beat_step: int | None = None
        self._delivered_beat_step: int | None = None
        self._beat_sent_at = -math.inf
        self._warned: set[str] = set()
        self._url, self._api_token, self._join = url if offline else checked_url(url), token, join
        self._offline = offline
        self._connection = IngestConnection(url, run_id, token) if run_id is not None else None
        self._ingest = (run_id, token)  # the run and its ingest token: the relay's own connection's, once known
        self._relay_spot = None if offline else relay_spot
        self._relay: relay.Relay | relay.RelayClient | None = None
        if self._connection is None and join is None:
            raise ValueError("a reporter needs a run id, or a join request to get one")
        # A run launched elsewhere: the server's stop request, and how this process ended (wire.ENDINGS).
        self._stop_requested = threading.Event()
        self._ending: str = "exited"
        self._flushing = False  # the final flush has begun: its last batch says how this process ended
        self._error: str | None = None
        self._files = RankFiles.of(Path(spool_dir), self._host, rank)
        self._spool = Spool(self._files.batches, self._warn)
        self._aside = SetAside(self._files.aside, self._warn)
        self._failure = ""  # the server's last error of its own, for the line that sets a batch aside
        self._retry_at, self._retry_delay = 0.0, _RETRY_FIRST_S  # a spool left by a previous process goes first
        self._last_attempt = -math.inf
        self._reachable = True
        self._run_over = False
        self._dumped = 0  # the last dump request this rank answered: each is answered once
        self._closed = False
        self._deadline = math.inf  # set by close(): after it, nothing waits on the network
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rankboard-reporter-rank{rank}", daemon=True)
        if start:
            self._thread.start()
            atexit.register(self.close)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Reporter | None:
        """The reporter a launcher's environment describes, or None outside a dashboard run."""
        run_id = environ.get(wire.ENV_RUN_ID)
        if not run_id:
            return None
        url = environ.get(wire.ENV_SERVER_URL)
        if not url:
            _stderr(f"{wire.ENV_RUN_ID} is set but {wire.ENV_SERVER_URL} is not; metrics will not be sent")
            return None
        spool_dir = environ.get(wire.ENV_RUN_DIR) or os.path.join(tempfile.gettempdir(), f"rankboard-{run_id}")
        flush, beat = _intervals(environ)
        token = environ.get(wire.ENV_TOKEN, "")
        spot = relay.spot_from_env(environ, token=token, run_key=f"{run_id}/{environ.get(wire.ENV_LAUNCH_ID, '')}")
        return cls(url, run_id, token, spool_dir, rank=int(environ.get("RANK", "0")), flush_interval=flush,
                   heartbeat_interval=beat, relay_spot=spot)  # fmt: skip

    def stop_requested(self) -> bool:
        """Whether the dashboard asked this run (launched elsewhere, with takes_stop) to stop."""
        return self._stop_requested.is_set()

    def ended(self, how: str, error: str | None = None) -> None:
        """Say how this process ends (wire.ENDINGS); a run launched elsewhere sends it with its last batch."""
        if self._ending != "failed":  # the first exception is the one that explains
            self._ending, self._error = how, error

    @property
    def spool_path(self) -> Path:
        """Where batches wait while the server cannot be reached."""
        return self._spool.path

    def log(self, metrics: Mapping[str, object], *, step: int | None = None, rank: int | None = None) -> None:
        """Queue one point per metric at `step` (None: the step after the last one logged); returns at once and never
        raises. `rank` reports for another rank (rank 0 relaying what it gathered from all of them); by default the
        point is this process's rank's. The values it takes: see the module's `log()`."""
        if self._closed:
            self._warn("closed", "log() after close() is ignored")
            return
        if step is None:
            step = self._step_counted()
        self._step = step  # checked by the thread, where a step that is no plain int costs the loop nothing
        # The training loop's cost: a plain float goes straight into the queue, in a loop that nothing else slows
        # (bench/log_call.py); every other value (a nested mapping, a tensor, an int) takes _queue_other.
        now = time.time()
        try:
            items = metrics.items()
        except AttributeError:
            self._warn("not a mapping", f"log() takes a mapping of names to numbers, not {_described(metrics)}")
            return
        for key, value in items:
            if type(value) is float:
                self._points.append((key, step, value, now, rank))
            else:
                self._queue_other(key, value, step, now, rank)
        if len(self._points) >= self._max_batch and not self._wake.is_set():
            self._wake.set()

    def sample(self, metrics: Mapping[str, float], *, step: int) -> None:
        """Queue samples at a step of a clock's (rankboard.gpu's: unix seconds), which never moves log()'s counter."""
        if self._closed:
            return
        now = time.time()
        for key, value in metrics.items():
            self._queue_other(key, value, step, now, None)
        if len(self._points) >= self._max_batch and not self._wake.is_set():
            self._wake.set()

    def _step_counted(self) -> int:
        """The step of a log() that names none: the one after the last step logged (a numpy or torch integer
        included), or, after one that is no integer (skipped by the thread), after the last one counted here."""
        last = self._step
        if type(last) is not int:
            last = _index(last)
        step = last + 1 if last >= 0 else self._counted
        self._counted = step + 1
        return step

    def _last_step(self) -> int:
        """The step the last log() used; 0 before the first, or after one that is no integer."""
        return max(_index(self._step), 0)

    def _queue_other(self, key: object, value: object, step: int, now: float, rank: int | None) -> None:
        """Queue a value that is no plain float: a mapping flattened under `key`, a number as a float, and anything
        else refused with a warning naming the key, once per key."""
        if type(value) is dict:  # before the numbers: the common nested case, and a check cheaper than Mapping's
            self._queue_nested(key, value, step, now, rank)
            return
        try:
            number = _number(value)
        except Exception as error:  # a tensor that cannot be read (a CUDA error): said, never raised into the loop
            self._warn(f"value {key}", f"metric {key!r}: {_described(value)} cannot be read ({error!r}); skipped")
            return
        if number is not None:
            self._points.append((key, step, number, now, rank))  # type: ignore[arg-type]  # _columns checks the key
        elif isinstance(value, Mapping):
            self._queue_nested(key, value, step, now, rank)
        else:
            self._warn(f"value {key}", f"metric {key!r}: {_described(value)} is not a number; skipped")

    def _queue_nested(self, prefix: object, metrics: Mapping[object, object], step: int, now: float,
                      rank: int | None) -> None:  # fmt: skip
        """Queue a mapping's values under `prefix/key`, at any depth."""
        for key, value in metrics.items():
            if not (isinstance(prefix, str) and isinstance(key, str)):
                self._warn(f"key {prefix!r}/{key!r}"[:100], f"metric {prefix!r} holds the key {key!r}: nested keys "
                                                           "must be strings, joined by '/'; skipped")  # fmt: skip
                continue
            name = f"{prefix}/{key}"
            if len(name) > wire.MAX_KEY_LENGTH:  # also ends a mapping that holds itself
                self._warn(f"key {name[:80]}", f"metric {name[:80]!r}...: longer than {wire.MAX_KEY_LENGTH} "
                                               "characters; skipped")  # fmt: skip
            elif type(value) is float:
                self._points.append((name, step, value, now, rank))
            else:
                self._queue_other(name, value, step, now, rank)

    def progress(
        self,
        progress: wire.Progress | None = None,
        *,
        step: int | None = None,
        total_steps: int | None = None,
        epoch: int = 0,
        epochs: int = 0,
        samples_per_s: float = 0.0,
    ) -> None:
        """Set the progress that the next batch carries: a whole `wire.Progress`, or its fields (see the module's
        `progress()`: `step` None follows the last step logged, `total_steps` None keeps the one declared)."""
        if progress is not None:
            self._progress = _SetProgress(progress, whole=True)
            return
        if total_steps is not None:
            self._total_steps = total_steps
        made = wire.Progress(epoch=epoch, epochs=epochs, step=0 if step is None else step,
                             total_steps=self._total_steps, samples_per_s=samples_per_s)  # fmt: skip
        self._progress = _SetProgress(made, follows_log=step is None)  # one assignment: the thread reads it whole

    def node(self, node: wire.Node) -> None:
        """Set this node's GPU inventory; the next batch carries it if it differs from the last one sent."""
        self._node = node

    def heartbeat(self, step: int) -> None:
        """Say this rank reached `step`; returns at once. Sent at most every `heartbeat_interval` seconds, and only
        when the step moved, so that the server's time of a rank's last heartbeat goes stale when the rank hangs."""
        self._beat_step = step

    def close(self, timeout: float = 10.0) -> None:
        """Send or spool everything queued, then stop the thread; waits at most about `timeout` seconds."""
        if self._closed:
            return
        self._deadline = time.monotonic() + timeout
        self._closed = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        else:
            self._guarded(self._flush_all)
        atexit.unregister(self.close)

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._pause())
            self._wake.clear()
            self._guarded(self._tick)
        self._guarded(self._flush_all)

    def _pause(self) -> float:
        """Until the next tick: with a relay, at the next multiple of the interval on the node's clock, so that the
        node's ranks post at once and the relay's window gathers them all into one post."""
        if self._relay_spot is None:
            return self._flush_interval
        return self._flush_interval - time.time() % self._flush_interval

    def _guarded(self, work: Callable[[], None]) -> None:
        # Training must outlive any bug in here; the same error is reported once, not at every tick.
        try:
            work()
        except Exception as error:
            self._warn(f"bug {type(error).__name__}", f"reporter error, carrying on: {error!r}")

    def _tick(self) -> None:
        if self._run_over:
            self._points.clear()
            return
        if self._spool.pending and time.monotonic() >= self._retry_at:
            self._replay_spool()
        if self._points:
            # What was queued by now, and no more: what the loop logs during these posts waits for the next tick.
            # Draining to empty instead chased the loop with back-to-back posts of a few steps each: 430 in a
            # 1,024-step mlp run where one a tick makes 6, and the run was 8% slower for it (bench/trainer_speed.py).
            due = len(self._points)
            while due > 0 and not self._run_over:
                batch = self._take_batch(due)
                due -= len(batch)
                self._deliver(batch)
        elif self._heartbeat_due(self._last_attempt) and not self._spool.pending:
            self._deliver([])
        if self._aside.due() and self._takes_batches():
            self._aside.retry(self._post_again)  # only while the server takes the rest: then a failure counts

    def _flush_all(self) -> None:
        """Send or spool every queued point, and the last progress; runs once, when closing."""
        self._flushing = True
        if self._spool.pending:
            self._replay_spool()
        self._beat_sent_at = -math.inf  # the last heartbeat goes now, however recent the one before
        progress = self._progress_due()
        final_progress_due = (
            (progress is not None and progress is not self._delivered_progress)
            or any(self._due_extras())
            or self._join is not None
        )
        while (self._points or final_progress_due) and not self._run_over:
            self._deliver(self._take_batch(), keep_empty=True)
            final_progress_due = False
        if self._aside.pending and self._takes_batches():
            self._aside.retry(self._post_again, counted=False)  # this process's last go; the file keeps the rest
        if self._connection is not None:
            self._connection.close()
        if self._relay is not None:
            self._relay.close()
        if self._join is not None:
            self._leave_for_sync()

    def _leave_for_sync(self) -> None:
        """A run launched elsewhere whose batches the server did not all take (or, offline, never saw): leave beside
        the spool what `rankboard sync` needs with them, the join request and how this process ended."""
        left = self._spool.pending or self._aside.pending or self._connection is None
        if self._run_over or not (self._offline or left):
            return  # all taken; or refused for good, nothing kept
        assert self._join is not None
        try:
            self._files.write_ended(wire.Ended(self._rank, self._host, self._ending, self._error))
            if not self._offline:  # offline, init() wrote it at the start
                self._files.write_join(self._join)
        except OSError as error:
            self._warn("sync files", f"cannot write {self._files.ended} ({error}); a sync will not know how it ended")
            return
        if not self._offline:
            folder = self._files.folder
            _stderr(f"[rank {self._rank}] the server did not take all of this run; what it lacks waits in {folder}: "
                    f"`rankboard sync {folder}` uploads it")  # fmt: skip

    def _takes_batches(self) -> bool:
        """Whether the server took the last batch sent, and nothing waits in the spool."""
        return self._reachable and not self._spool.pending and not self._run_over

    def _take_batch(self, most: int = wire.MAX_POINTS_PER_BATCH) -> list[_Raw]:
        return [self._points.popleft() for _ in range(min(len(self._points), self._max_batch, most))]

    def _deliver(self, points: list[_Raw], *, keep_empty: bool = False) -> None:
        """Send a batch, or spool it: always while older batches wait in the spool, so that order is kept, unless the
        only one waiting is a batch the server failed on: this one then tells whether that batch or the server is at
        fault (an empty heartbeat would not: a server that cannot write may still take it)."""
        progress = self._progress_due()
        node, beat = self._due_extras()
        ended = self._ended_now()
        body = self._encode(points, progress, node=node, heartbeat=beat, ended=ended)
        outcome = None
        if not self._spool.pending or (self._spool.lone_failure and (points or keep_empty)):
            outcome = self._post(body)
            if not outcome.keeps:
                if self._spool.pending and outcome is not Outcome.RUN_OVER:
                    self._spool.set_aside_rest(self._set_aside)  # the server takes batches, not that one
                self._delivered_extras(node, beat, progress)
                return
            self._retry_at = time.monotonic() + self._retry_delay
        if not points and not keep_empty:
            return  # a failed heartbeat carries nothing worth keeping; the node waits for the next batch
        if ended is not None:  # never spooled: replayed by this rank's next process, it would end that one's run
            body = self._encode(points, progress, node=node, heartbeat=beat)
        try:
            self._spool.append(body, failed=outcome is Outcome.SERVER_ERROR)
            self._delivered_extras(node, beat, progress)
        except OSError as error:
            self._warn("spool write", f"cannot write the spool {self._spool.path} ({error}); points are lost")

    def _replay_spool(self) -> None:
        if self._offline:
            return
        if self._spool.replay(self._post, self._set_aside).keeps:
            self._retry_at = time.monotonic() + self._retry_delay
            self._retry_delay = min(2 * self._retry_delay, _RETRY_MAX_S)
        else:
            self._retry_delay = _RETRY_FIRST_S

    def _set_aside(self, batch: bytes) -> None:
        try:
            self._aside.add(batch)
        except OSError as error:
            self._warn("aside write", f"cannot write {self._aside.path} ({error}); a batch the server failed on, "
                                      "while it took the next, is lost")  # fmt: skip
            return
        self._warn("set aside", f"the server failed on a batch ({self._failure}) but took the next; that batch "
                                f"waits in {self._aside.path}, to be tried later, and the rest go on")  # fmt: skip

    def _ended_now(self) -> wire.Ended | None:
        """How this process ended, on the last batch of a run launched elsewhere: the final flush's, once nothing
        else is left (not a tick's racing with close(): finished() may still come, and the last heartbeat)."""
        if self._join is None or not self._flushing or self._points:
            return None
        return wire.Ended(self._rank, self._host, self._ending, self._error)

    def _post_again(self, body: bytes) -> Outcome:
        """Post a batch set aside: its failing again says nothing new about the server."""
        return self._post(body, quiet=True)

    def _post(self, body: bytes, *, quiet: bool = False) -> Outcome:
        if self._run_over:
            return Outcome.RUN_OVER
        if self._offline:
            return Outcome.RETRY  # kept in the spool, for `rankboard sync`: never a connection
        if time.monotonic() + _REQUEST_TIMEOUT_S > self._deadline:
            return Outcome.RETRY  # close() has not the time left to wait for the server
        self._last_attempt = time.monotonic()
        if self._connection is None and (joined := self._join_run()) is not Outcome.ACCEPTED:
            return joined
        assert self._connection is not None
        status, detail, reply = self._relayed(body) or self._connection.post(body)
        outcome = outcome_of(status)
        if not (quiet and outcome.keeps):
            self._note(outcome, status, detail)
        if outcome is Outcome.ACCEPTED and self._join is not None and _asks_stop(reply):
            self._stop_requested.set()
        if outcome is Outcome.ACCEPTED and wire.DUMP_REPLY_MARK in reply:  # else nothing is parsed
            self._guarded(lambda: self._answer_dump(reply))  # the batch was taken whatever becomes of the dump
        return outcome

    def _relayed(self, body: bytes) -> relay.Answer | None:
        """The server's answer to a batch sent through the node's relay; None: there is none to use now."""
        spot = self._relay_spot
        if spot is None:
            return None
        if self._relay is None:
            self._relay = self._open_relay(spot)
        return self._relay.post(body)

    def _open_relay(self, spot: relay.Spot) -> relay.Relay | relay.RelayClient:
        """Local rank 0 runs its node's relay, on a connection of its own; the other ranks (and a local rank 0 whose
        address is taken) post through it."""
        run_id, token = self._ingest
        if spot.local_rank == 0 and run_id is not None:
            window = min(0.25 * self._flush_interval, 0.5)
            serving = relay.Relay(spot, IngestConnection(self._url, run_id, token).post, window=window)
            if serving.start():
                return serving
        return relay.RelayClient(spot)

    def _join_run(self) -> Outcome:
        """Joins the run of this process's job (launched elsewhere); the ingest connection is then the run's."""
        assert self._join is not None
        status, joined, detail = external.join(self._url, self._api_token, self._join)
        if joined is not None:
            self._connection = IngestConnection(self._url, joined.run_id, joined.token)
            self._ingest = (joined.run_id, joined.token)
            _stderr(f"[rank {self._rank}] reporting into run {joined.run_id} ({self._join.key})")
            with contextlib.suppress(OSError):  # what an earlier process of this rank left for a sync is stale now
                self._files.forget()
            return Outcome.ACCEPTED
        outcome = outcome_of(status)
        if outcome.keeps:
            self._note(outcome, status, detail)
            return outcome
        self._run_over = True  # a wrong token or a refused request stays wrong: say so once, and send nothing
        self._warn("join", f"the server refused this process's join, so nothing is sent: {detail}")
        return Outcome.RUN_OVER

    def _answer_dump(self, reply: bytes) -> None:
        """Send this rank's stacks once per dump request the server's reply names (trainer/rankboard/forensics.py)."""
        request = json.loads(reply).get(wire.DUMP_REPLY_FIELD)
        if not isinstance(request, int) or request == self._dumped or self._connection is None:
            return
        # Twice the heartbeat interval: each rank answers within one of the request, so still ranks' watches overlap.
        watch = forensics.Watch(lambda: self._beat_step, 2 * self._heartbeat_interval, lambda: self._closed)
        dump = forensics.take_dump(request, rank=self._rank, host=self._host, watch=watch)
        body = json.dumps(dump.to_json(), separators=(",", ":")).encode()
        status, detail, _reply = self._connection.post(body, self._connection.dump_path(request))
        if not outcome_of(status).keeps:
            self._dumped = request
            _stderr(f"[rank {self._rank}] sent its stacks for dump request {request} ({detail[:60]})")

    def _note(self, outcome: Outcome, status: int | None, detail: str) -> None:
        # One line per change of state, not per batch: a down server must not flood the rank's log.
        if outcome is Outcome.SERVER_ERROR:
            self._failure = detail
        if outcome.keeps and self._reachable:
            self._reachable = False
            state = "unreachable" if outcome is Outcome.RETRY else "failing"
            _stderr(f"[rank {self._rank}] metrics server {state} ({detail}); spooling to {self._spool.path}")
        elif outcome is Outcome.ACCEPTED and not self._reachable:
            self._reachable = True
            _stderr(f"[rank {self._rank}] metrics server reachable again")
        elif outcome is Outcome.REJECTED:
            self._warn(f"status {status}", f"the server rejected a batch, which is dropped: {detail}")
        elif outcome is Outcome.RUN_OVER:
            self._run_over = True
            self._warn("run over", f"the server says the run is over ({detail}); no more metrics will be sent")

    def _due_extras(self) -> tuple[wire.Node | None, wire.Heartbeat | None]:
        """The node inventory and heartbeat the next batch should carry: each only when new."""
        node = self._node if self._node != self._delivered_node else None
        step = self._beat_step
        if step is None or step == self._delivered_beat_step:
            return node, None
        if not self._heartbeat_due(self._beat_sent_at):
            return node, None
        if type(step) is not int or not 0 <= step <= wire.MAX_STEP:
            step = self._good_step("heartbeat", step)
        return node, None if step is None else wire.Heartbeat(self._rank, self._host, step)

    def _heartbeat_due(self, since: float) -> bool:
        """Whether a heartbeat interval has passed since `since`. With a relay, ticks fall on the interval's grid and
        each post waits out the relay's window: half a tick's slack keeps heartbeats on every other grid tick (2 s),
        where an exact comparison would push each to the tick after (3 s)."""
        slack = self._flush_interval / 2 if self._relay_spot is not None else 0.0
        return time.monotonic() - since >= self._heartbeat_interval - slack

    def _progress_due(self) -> wire.Progress | None:
        """The progress the next batch carries: one given whole on every batch, one made from fields only when it
        differs from the last delivered (its step the last one logged where the script gave none)."""
        current = self._progress
        if current is None:
            return None
        progress = current.progress
        if current.follows_log:
            progress = dataclasses.replace(progress, step=self._last_step())
        return progress if current.whole or progress != self._delivered_progress else None

    def _delivered_extras(
        self, node: wire.Node | None, beat: wire.Heartbeat | None, progress: wire.Progress | None = None
    ) -> None:
        if progress is not None:
            self._delivered_progress = progress
        if node is not None:
            self._delivered_node = node
        if beat is not None:
            self._delivered_beat_step, self._beat_sent_at = beat.step, time.monotonic()

    def _encode(
        self,
        raw: Iterable[_Raw],
        progress: wire.Progress | None,
        *,
        node: wire.Node | None = None,
        heartbeat: wire.Heartbeat | None = None,
        ended: wire.Ended | None = None,
    ) -> bytes:
        if progress is not None:
            progress, mended = sendable_progress(progress)
            for field, sentence in mended:
                self._warn(f"progress {field}", sentence)
        batch = wire.Batch(columns=self._columns(raw), progress=progress, node=node, heartbeat=heartbeat, ended=ended)
        return json.dumps(batch.to_json(), separators=(",", ":")).encode()  # NaN and infinities written bare

    def _columns(self, raw: Iterable[_Raw]) -> tuple[wire.Column, ...]:
        """The points as one column per (key, rank), in the order logged. Checked here rather than in log(): one bad
        key, rank or step would otherwise get the whole batch refused with a 422. This loop is most of the thread's
        work, so each point costs a dict lookup and three appends."""
        groups: dict[tuple[str, int], tuple[list[int], list[float], list[float]]] = {}
        for key, step, value, unix_time, rank in raw:
            column = groups.get((key, self._rank if rank is None else rank))
            if column is None:
                owner = self._column_rank(key, rank)
                if owner is None:
                    continue
                column = groups[(key, owner)] = ([], [], [])
            if type(step) is not int or not 0 <= step <= wire.MAX_STEP:
                fixed = self._good_step(f"metric {key!r}", step)
                if fixed is None:
                    continue
                step = fixed
            column[0].append(step)
            column[1].append(value)
            column[2].append(unix_time)
        return tuple(wire.Column(key, rank, *arrays) for (key, rank), arrays in groups.items())

    def _column_rank(self, key: object, rank: object) -> int | None:
        """The rank a new column goes under (this process's, or a plain int for a numpy or torch one); None, with a
        warning, for a key or rank the server would refuse."""
        if not (isinstance(key, str) and 0 < len(key) <= wire.MAX_KEY_LENGTH):
            self._warn(f"key {key!r}"[:100], f"metric key {key!r} must be a string of 1..{wire.MAX_KEY_LENGTH} "
                                             "characters; skipped")  # fmt: skip
            return None
        owner = self._rank if rank is None else _index(rank)
        if 0 <= owner <= wire.MAX_RANK:
            return owner
        self._warn(f"rank {rank!r}"[:100], f"metric {key!r}: rank {rank!r} is not an integer in 0..{wire.MAX_RANK}; "
                                           "skipped")  # fmt: skip
        return None

    def _good_step(self, owner: str, step: object) -> int | None:
        """A step that is no plain int (a numpy or torch integer) as an int; None, with a warning, for one that is
        not an integer in 0..MAX_STEP. `owner`: whose step, as the warning names it."""
        index = _index(step)
        if 0 <= index <= wire.MAX_STEP:
            return index
        self._warn(f"step {owner}", f"{owner}: step {step!r} is not an integer in 0..{wire.MAX_STEP}; skipped")
        return None

    def _warn(self, topic: str, message: str) -> None:
        if topic not in self._warned:
            self._warned.add(topic)
            _stderr(f"[rank {self._rank}] {message}")


def _index(number: object) -> int:
    """An integer, numpy's and torch's included, as a plain int; -1 for anything else."""
    try:
        return operator.index(number)  # type: ignore[arg-type]
    except TypeError:
        return -1


# No cluster trains this fast: a rate above it comes from a clock (a step timed at 0 s), not from the training.
MAX_SAMPLES_PER_S = 1e12
# A progress's counts, each with its largest value the server takes.
_PROGRESS_COUNTS = {"epoch": wire.MAX_EPOCH, "epochs": wire.MAX_EPOCH, "step": wire.MAX_STEP,
                    "total_steps": wire.MAX_STEP, "restart": 1_000_000}  # fmt: skip


def sendable_progress(progress: wire.Progress) -> tuple[wire.Progress | None, list[tuple[str, str]]]:
    """The progress as the server takes it, and what was mended: (field, a sentence to warn with) each.

    A rate that is not a number in 0..MAX_SAMPLES_PER_S (an infinity from a step timed at 0 s, a NaN) goes as 0,
    which the dashboard reads as none measured: it keeps the last rate it had. Counts go as plain ints (a numpy or
    torch integer, a float cut to a whole one); one that is not a count in range, or not a number, leaves the whole
    progress out, since none of it can be trusted: the batch's points go without it.
    """
    counts: dict[str, int] = {}
    mended: list[tuple[str, str]] = []
    for field, most in _PROGRESS_COUNTS.items():
        value = getattr(progress, field)
        count = _count(value)
        if not 0 <= count <= most:
            return None, [(field, f"progress {field}={value!r} is not a count in 0..{most}; progress not sent")]
        if count != value:
            mended.append((field, f"progress {field}={value!r} is not a whole number; sent as {count}"))
        counts[field] = count
    rate = _float(progress.samples_per_s)
    if not 0 <= rate <= MAX_SAMPLES_PER_S:
        mended.append(("samples_per_s", f"progress samples_per_s={progress.samples_per_s!r} is not a rate in "
                                        f"0..{MAX_SAMPLES_PER_S:g}; sent as 0 (none measured)"))  # fmt: skip
        rate = 0.0
    return wire.Progress(**counts, samples_per_s=rate, finished=bool(progress.finished)), mended


def _count(number: object) -> int:
    """A count as a plain int: an integer (numpy's and torch's included) as one, any other number cut to a whole one;
    -1 for anything else."""
    index = _index(number)
    if index != -1 or isinstance(number, int):
        return index
    as_float = _float(number)
    return int(as_float) if math.isfinite(as_float) else -1


def _float(number: object) -> float:
    """A number (numpy's and torch's included) as a float; NaN for anything else."""
    try:
        return float(number)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _number(value: object) -> float | None:
    """A metric's value as a float; None for what is not one number. Neither torch nor numpy is imported: an int
    or bool (True is 1.0), a numpy scalar and anything else with `__float__` is read with float(), a tensor or array
    of one element (torch's, numpy's, JAX's) with `.item()`, which on a GPU waits for the GPU (a sync); never a
    string's text."""
    if isinstance(value, (int, float)):
        return float(value)
    numpy = sys.modules.get("numpy")  # only a script that imported numpy has its scalars
    if numpy is not None and isinstance(value, numpy.generic):  # float() costs a tenth of .item() on these
        return float(value) if isinstance(value, (numpy.integer, numpy.floating, numpy.bool_)) else None
    if isinstance(value, (str, bytes, bytearray, complex)):
        return None
    item = getattr(value, "item", None)
    if callable(item):
        if not _one_element(value):
            return None
        value = item()
        return float(value) if isinstance(value, (int, float)) else None  # a complex tensor's is refused
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _one_element(value: object) -> bool:
    """Whether a tensor or array (torch's, numpy's, JAX's) holds exactly one element."""
    if getattr(value, "ndim", None) == 0:
        return True
    numel = getattr(value, "numel", None)  # torch's size is a method, numpy's a number
    return (numel() if callable(numel) else getattr(value, "size", None)) == 1


def _described(value: object) -> str:
    """A value as a warning names it: a tensor or array by its type and shape, never all its elements."""
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple):  # torch.Size is a tuple too
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def json_safe(value: Any) -> Any:
    """A config with its NaN and infinities as the strings `wire.encode_value` writes: JSON has no such numbers, and
    the server refuses them where they are not a metric's values."""
    if isinstance(value, float) and not math.isfinite(value):
        return wire.encode_value(value)
    if isinstance(value, Mapping):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def _asks_stop(reply: bytes) -> bool:
    try:
        return json.loads(reply).get("stop") is True
    except (ValueError, AttributeError):
        return False


def _stderr(message: str) -> None:
    print(f"rankboard: {message}", file=sys.stderr, flush=True)


def report_interval(environ: Mapping[str, str] = os.environ) -> float:
    """RANKBOARD_REPORT_S, brought within REPORT_S_RANGE; the default when unset or not a number."""
    interval, problem = wire.seconds_from_env(environ, ENV_REPORT_S, DEFAULT_REPORT_S, *REPORT_S_RANGE)
    if problem:
        _stderr(f"{problem}; posting every {interval:g} s")
    return interval


def _intervals(environ: Mapping[str, str]) -> tuple[float, float]:
    """A reporter's flush and heartbeat intervals, from RANKBOARD_REPORT_S."""
    interval = report_interval(environ)
    return interval, max(HEARTBEAT_S, interval)


# The process-wide reporter behind the module functions: made on first use, so only a process that reports
# (rank 0 in the bundled trainer) starts a thread.
_default: Reporter | None = None
_default_made = False
_default_lock = threading.Lock()


def _reporter() -> Reporter | None:
    global _default, _default_made
    if not _default_made:
        with _default_lock:
            if not _default_made:
                try:
                    _default = Reporter.from_env()
                except Exception as error:  # a bad URL in the environment must not stop the training
                    _stderr(f"cannot report metrics: {error}")
                _default_made = True
    return _default


def init(
    server: str | None = None,
    name: str | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    token: str | None = None,
    key: str | None = None,
    takes_stop: bool = False,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    sample_gpus: bool = True,
    total_steps: int | None = None,
) -> Reporter | None:
    """Report a script launched elsewhere (its own sbatch, torchrun or Kubernetes job) into one run; call it on every
    rank, before the first log(). Returns at once: the reporter's thread joins the run, and spools until it can.

    `server` and `token` (an API token of an operator) default to RANKBOARD_URL and RANKBOARD_TOKEN, `name` to
    RANKBOARD_RUN_NAME or the script's file name, `key` to RANKBOARD_RUN_KEY or the job's own id (rankboard.external).
    With RANKBOARD_MODE=offline nothing is sent: the run goes to a folder under RANKBOARD_OFFLINE_DIR, for
    `rankboard sync` (rankboard.offline).
    `takes_stop`: the script checks `stop_requested()` and stops itself, so the dashboard may offer Stop.
    `checkpoint_dir`: where it saves checkpoints named `wire.checkpoint_name(step)`, in the shared folder, for the
    dashboard to list, inspect, download and prune. Each
    node's local rank 0 also samples its GPUs (`sample_gpus`). In a run that Rankboard launched, the launcher's
    environment already says all this: the arguments are ignored, but for `total_steps`, the steps the script will
    train, which the dashboard shows progress against in either kind of run (see progress()). Never raises.
    """
    global _default, _default_made
    environ = os.environ
    total = _declared_total(total_steps)
    with _default_lock:
        if environ.get(wire.ENV_RUN_ID) or _default_made:
            if _default_made and not environ.get(wire.ENV_RUN_ID):
                _stderr("report.init() was called after the reporter was made (a second init, or a log before it)")
        else:
            _default = _external_reporter(server, name, config, token=token, key=key, takes_stop=takes_stop,
                                          checkpoint_dir=checkpoint_dir, total_steps=total)  # fmt: skip
            _default_made = True
            sys.excepthook = _note_uncaught(sys.excepthook)
    reporter = _reporter()
    if reporter is not None and total is not None:
        reporter.progress(total_steps=total)
    if reporter is not None and sample_gpus:
        from . import gpu  # here: a script that samples nothing never imports NVML's bindings

        gpu.start_sampling(reporter, environ=environ)
    return reporter


def _external_reporter(
    server: str | None,
    name: str | None,
    config: Mapping[str, Any] | None,
    *,
    token: str | None,
    key: str | None,
    takes_stop: bool,
    checkpoint_dir: str | os.PathLike[str] | None,
    total_steps: int | None,
) -> Reporter | None:
    environ = os.environ
    url = server or environ.get(wire.ENV_URL)
    mode, problem = offline.mode(environ)
    if problem:
        _stderr(problem)
    if not url and mode != "offline":
        _stderr(f"report.init() has no server (server=... or {wire.ENV_URL}, or {offline.ENV_MODE}=offline); "
                "metrics will not be sent")  # fmt: skip
        return None
    try:
        name = name or environ.get(wire.ENV_RUN_NAME) or Path(sys.argv[0] or "python").stem
        safe_config = json_safe(config or {})
        if json.dumps(safe_config, default=str) != json.dumps(config or {}, default=str):  # never ==: numpy arrays
            _stderr('report.init(): the config\'s NaN and infinities are sent as the strings "NaN" and "Infinity"')
        request = external.join_request(environ, key=key, name=name, config=safe_config, takes_stop=takes_stop,
                                        checkpoint_dir=checkpoint_dir, total_steps=total_steps)  # fmt: skip
        spool_dir = _spool_folder(environ, request, mode)
        api_token = token if token is not None else environ.get(wire.ENV_TOKEN, "")
        flush, beat = _intervals(environ)
        spot = relay.spot_from_env(environ, token=api_token, run_key=request.key)
        return Reporter(url or "", None, api_token, spool_dir, rank=request.rank, flush_interval=flush,
                        heartbeat_interval=beat, join=request, offline=mode == "offline", relay_spot=spot)  # fmt: skip
    except Exception as error:  # a bad URL or environment must not stop the training
        _stderr(f"cannot report metrics: {error}")
        return None


def _spool_folder(environ: Mapping[str, str], request: wire.Join, mode: str) -> Path:
    """Where a run launched elsewhere keeps its batches: online, a temporary folder keyed by the run (the same for a
    restarted process); offline, its folder under RANKBOARD_OFFLINE_DIR, which starts with this rank's join request."""
    if mode != "offline":
        digest = hashlib.sha256(request.key.encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"rankboard-{digest}"
    folder = offline.run_folder(environ, request.key)
    RankFiles.of(folder, request.host, request.rank).write_join(request)
    if environ.get("LOCAL_RANK", "0") == "0":  # once a node, not once a rank
        _stderr(f"offline ({offline.ENV_MODE}=offline): this run is written to {folder}; "
                f"`rankboard sync {folder}` uploads it")  # fmt: skip
    return folder


def _declared_total(total_steps: object) -> int | None:
    """init()'s total as a plain int; None, with a line on stderr, for one the server would refuse."""
    if total_steps is None:
        return None
    count = _count(total_steps)
    if 0 <= count <= wire.MAX_STEP:
        return count
    _stderr(f"report.init(): total_steps={total_steps!r} is not a count in 0..{wire.MAX_STEP}; no total declared")
    return None


def _note_uncaught(previous: Callable[..., Any]) -> Callable[..., Any]:
    """An excepthook that first tells the reporter the process failed, then does what the one before it did."""

    def hook(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        if _default is not None:
            _default.ended("failed", f"{kind.__name__}: {value}"[:2000])
        previous(kind, value, traceback)

    return hook


def stop_requested() -> bool:
    """Whether the dashboard asked this run to stop; for a run launched elsewhere with init(takes_stop=True), which
    checks it each step and stops itself (a run that Rankboard launched gets SIGTERM instead)."""
    return _default is not None and _default.stop_requested()


def log(metrics: Mapping[str, object], *, step: int | None = None, rank: int | None = None) -> None:
    """Queue one point per metric at this step, for this process's rank (or `rank`); a no-op outside a dashboard
    run. Returns at once and never raises: training never waits on it, nor fails by it.

    - A nested mapping is flattened, its keys joined by "/" at any depth: `{"train": {"loss": l}}` is `train/loss`.
    - `step` left out: the step after the one the last log() used, as `wandb.log` counts: 0, 1, 2... for calls that
      name none; a call that names one sets the counter, so the next one without continues at `step + 1`. One
      counter per process (each rank counts its own calls).
    - A value is a number: an int, a float, a bool (True as 1.0, as W&B takes it), a numpy scalar, or a tensor or
      array of one element (torch's, numpy's), read with `.item()`. On a GPU, `.item()` waits for the GPU to finish
      the work queued so far (a sync), as `loss.item()` in the loop does: where that matters, log such values every
      N steps. Neither torch nor numpy is imported by the client.
    - Anything else (a string, a list, None, a tensor of several elements) is skipped, with a warning on stderr
      naming its key, once per key.
    """
    reporter = _default if _default_made else _reporter()
    if reporter is not None:
        reporter.log(metrics, step=step, rank=rank)


def progress(
    progress: wire.Progress | None = None,
    *,
    step: int | None = None,
    total_steps: int | None = None,
    epoch: int = 0,
    epochs: int = 0,
    samples_per_s: float = 0.0,
) -> None:
    """Set where training stands, which the next batch carries: `report.progress(step=s, total_steps=n)` from a
    script, or a whole `wire.Progress` (the built-in trainer's).

    `step` left out follows the last step logged; `total_steps` left out keeps the total declared before (with
    init(total_steps=...) or here), and 0 means none: the dashboard then shows a step count, no progress bar.
    An epoch left at 0 says the script counts none. A no-op outside a dashboard run.
    """
    reporter = _default if _default_made else _reporter()
    if reporter is not None:
        reporter.progress(progress, step=step, total_steps=total_steps, epoch=epoch, epochs=epochs,
                          samples_per_s=samples_per_s)  # fmt: skip


def heartbeat(step: int) -> None:
    """Say this rank reached `step`; every rank calls it, each step if it likes (it costs a field assignment)."""
    reporter = _default if _default_made else _reporter()
    if reporter is not None:
        reporter.heartbeat(step)


def node(node: wire.Node) -> None:
    """Set this node's GPU inventory, which the next batch carries; `rankboard.gpu`'s sampler calls it."""
    reporter = _default if _default_made else _reporter()
    if reporter is not None:
        reporter.node(node)


def default_reporter() -> Reporter | None:
    """This process's reporter, made from the launcher's environment; None outside a dashboard run."""
    return _default if _default_made else _reporter()


def finished() -> None:
    """Say that training completed; call it once, after the last step (any rank; rank 0 is enough).

    The dashboard then calls the run succeeded whatever torchrun's exit code: with gloo a rank sometimes aborts at
    exit after a finished run ("terminate called without an active exception", see the DDP checklist), and torchrun
    then exits 1. The built-in trainer leaves the same marker. A run launched elsewhere (init) hears it with the
    process's last batch. A no-op outside a dashboard run.
    """
    if _default is not None:
        _default.ended("finished")
    run_dir = os.environ.get(wire.ENV_RUN_DIR)
    if not run_dir:
        return
    try:
        marker = Path(run_dir) / wire.FINISHED_MARKER
        with tempfile.NamedTemporaryFile("w", dir=run_dir, prefix=f".{marker.name}.", delete=False) as file:
            json.dump({"finished_at": time.time()}, file)
        os.replace(file.name, marker)  # whole or not at all
    except OSError as error:  # training is over and fine: only the verdict may be less sure
        _stderr(f"cannot leave the finished marker in {run_dir}: {error}")


def close(timeout: float = 10.0) -> None:
    """Send or spool everything queued and stop the reporter's thread; safe to call more than once."""
    if _default is not None:
        _default.close(timeout)


def leave_rank_marker(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Write this worker's ranks and node beside torchrun's error file (wire.RANK_MARKER); never raises.

    The dashboard labels a multi-node run's log folders with it: torchrun names each folder by local rank, and c10d
    gives agents their group rank in rendezvous order, so nothing outside the worker knows its global rank. A no-op
    outside a dashboard run or without torchrun's --log-dir (no error file then).
    """
    error_file = environ.get("TORCHELASTIC_ERROR_FILE")
    if not environ.get(wire.ENV_RUN_ID) or not error_file or "RANK" not in environ:
        return None
    marker = Path(error_file).parent / wire.RANK_MARKER
    try:
        body = {name.lower(): int(environ[name]) for name in ("RANK", "LOCAL_RANK", "GROUP_RANK") if name in environ}
        with tempfile.NamedTemporaryFile("w", dir=marker.parent, prefix=f".{marker.name}.", delete=False) as file:
            json.dump({**body, "node": socket.gethostname()}, file)
        os.replace(file.name, marker)  # whole or not at all: the server may read it at any moment
    except (OSError, ValueError) as error:  # only the label of a log is at stake: training goes on
        _stderr(f"cannot leave the rank marker {marker}: {error}")
        return None
    return marker


# At import, because every worker imports the client but some never call it (rank 1 of examples/ddp_train.py):
# one small write, once per process.
leave_rank_marker()
# And a reporter for every worker of a dashboard run, even one that never reports: its thread is what answers a dump
# request while the main thread hangs in a collective (an empty batch every heartbeat interval, whose reply asks).
if os.environ.get(wire.ENV_RUN_ID) and "LOCAL_RANK" in os.environ:
    _reporter()
