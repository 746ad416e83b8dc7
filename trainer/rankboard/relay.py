"""One post per node, not per rank: local rank 0's process relays its node's batches to the server as one.

Every rank's reporter posts a batch each flush interval. On a node of 8 ranks that is 8 posts where one would do, and
the server's cost is per post (issue 39). So local rank 0 listens on a Unix socket in Linux's abstract namespace,
named from the run, the node and the run's token (never reachable from another host; a rank in another network
namespace cannot see it and posts directly). The node's other ranks send it the very batch they would have posted;
it gathers what arrives within a short window after the first (or until every local rank sent one), posts them as
one batch (columns concatenated, heartbeats and endings in lists, split at wire's limits) and answers each rank with
the server's reply, once the server stored it: a stop or dump request in the reply still reaches every rank, and a
failure is the rank's to spool, as when it posts itself. A batch the server refuses or fails on is posted again
alone, so that one rank's bad batch never costs the others theirs.

A rank that cannot reach the relay (not up yet, local rank 0 gone) posts directly and tries the relay again at its
next post; one the relay refused, or that lost it mid-answer, tries again RETRY_S later. The relay runs on daemon
threads; a peer that sends garbage, stalls mid-frame or never reads its answer costs it one connection, never its
forwarding.

Framing, both ways: a request is `!II` (token length, body length), the token, the body; an answer is `!iII` (the
HTTP status, or NO_ANSWER or DIRECT; detail length; reply length), the detail line, the server's reply.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import queue
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import wire

ENV_RELAY = "RANKBOARD_RELAY"  # "off": every rank posts for itself, as before relays (a bench's baseline, an escape)
Answer = tuple[int | None, str, bytes]  # what IngestConnection.post returns: status (None: none), detail, reply
_REQUEST = struct.Struct("!II")
_ANSWER = struct.Struct("!iII")
NO_ANSWER = -1  # the server did not answer (the rank spools, as when its own post gets no answer)
DIRECT = -2  # the relay takes no batch from this peer now (refused, busy): post it to the server yourself
MAX_TOKEN_BYTES = 4096
MAX_BODY_BYTES = 16 * 2**20  # a batch of MAX_POINTS_PER_BATCH points is well under 1 MiB
MAX_PEERS = wire.MAX_RANKS_PER_BATCH
FRAME_S = 10.0  # a peer that starts a frame finishes it within this, or is dropped
# A rank waits this long for its answer (two server timeouts and the window), then posts itself: a frozen relay
# (its process stopped) delays a rank's post, and so its answer to a dump, by no more than this.
ANSWER_S = 12.0
RETRY_S = 10.0  # a rank the relay refused or failed posts directly this long before it tries again
# What the server's answer means for the batches in one relayed post: "this batch can never be taken" (a 4xx) or
# "failed on this batch" (a 500) may be one rank's fault alone, so those are posted again one by one.
_NOT_NOW = frozenset({408, 409, 429, 502, 503, 504})


@dataclass(frozen=True)
class Spot:
    """Where a node's relay listens, and who may use it."""

    address: str  # an abstract Unix socket name: starts with NUL
    token: bytes  # the run's token (for a run launched elsewhere, the API token every process joined with)
    local_rank: int
    local_world_size: int


def spot_from_env(environ: Mapping[str, str], *, token: str, run_key: str) -> Spot | None:
    """The relay of this process's node and run; None where there is none to share (one rank a node, not Linux,
    neither torchrun nor srun started the ranks) or RANKBOARD_RELAY=off."""
    place = _torchrun_place(environ) if "LOCAL_WORLD_SIZE" in environ else _srun_place(environ)
    if not sys.platform.startswith("linux") or place is None or environ.get(ENV_RELAY, "").lower() == "off":
        return None
    local_rank, local_world, node = place
    if local_world < 2 or not 0 <= local_rank < local_world:
        return None
    # The token is part of the name: without it no one can even find the socket (abstract names have no permissions).
    digest = hashlib.sha256("\0".join((token, run_key, node)).encode()).hexdigest()[:40]
    return Spot(f"\0rankboard-relay-{digest}", token.encode(), local_rank, local_world)


Place = tuple[int, int, str]  # the local rank, the node's number of ranks, the node as the relay's name has it


def _torchrun_place(environ: Mapping[str, str]) -> Place | None:
    """Where torchrun put this worker: its agent's node (several agents may share a host under Slurm)."""
    local_rank, local_world = environ.get("LOCAL_RANK", ""), environ["LOCAL_WORLD_SIZE"]
    if not (local_rank.isdigit() and local_world.isdigit()):
        return None
    node = f"{wire.node_name(environ, socket.gethostname())}/{environ.get('GROUP_RANK', '')}"
    return int(local_rank), int(local_world), node


def _srun_place(environ: Mapping[str, str]) -> Place | None:
    """Where srun put this task, when srun started each rank itself (no torchrun): SLURM_LOCALID among the tasks of
    its node, which SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE) counts node by node, in SLURM_NODEID's
    order, written as "8(x3),4"."""
    local_id, node_id = environ.get("SLURM_LOCALID", ""), environ.get("SLURM_NODEID", "")
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE", "")
    counts: list[int] = []
    for part in per_node.split(","):
        count, _, repeat = part.partition("(x")
        repeat = repeat.removesuffix(")") if repeat else "1"
        if not (count.isdigit() and repeat.isdigit()):
            return None
        counts += [int(count)] * int(repeat)
    if not (local_id.isdigit() and node_id.isdigit() and int(node_id) < len(counts)):
        return None
    return int(local_id), counts[int(node_id)], f"{socket.gethostname()}/slurm-{node_id}"


@dataclass
class _Waiting:
    """One batch handed to the relay, and its answer once the server gave one."""

    body: bytes
    sender: object
    done: threading.Event = field(default_factory=threading.Event)
    answer: Answer | None = None


class Relay:
    """Local rank 0's side: takes batches (in process, and from its node's ranks) and posts them as one."""

    def __init__(self, spot: Spot, post: Callable[[bytes], Answer], *, window: float) -> None:
        """`post`: sends one batch to the server (an IngestConnection's, used from the relay's thread alone);
        `window`: how long after a batch arrives the relay waits for the rest of its node's."""
        self._spot, self._post, self._window = spot, post, window
        self._queue: queue.Queue[_Waiting] = queue.Queue(maxsize=4 * MAX_PEERS)
        self._listener: socket.socket | None = None
        self._peers = threading.BoundedSemaphore(MAX_PEERS)
        self._closed = threading.Event()
        self.posts = 0  # made to the server: for tests and benches
        self._failed = False  # a bug of the relay's own was said

    def start(self) -> bool:
        """Listen and forward; False, and nothing started, if the socket cannot be had (another relay has it)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self._spot.address)
            listener.listen(MAX_PEERS)
        except OSError:
            listener.close()
            return False
        self._listener = listener
        threading.Thread(target=self._accept, name="rankboard-relay-accept", daemon=True).start()
        threading.Thread(target=self._forward, name="rankboard-relay", daemon=True).start()
        return True

    def post(self, body: bytes, sender: object = "self", wait: float = ANSWER_S) -> Answer | None:
        """Relay one batch and wait for the server's answer; None: the relay cannot take it, post it directly."""
        waiting = _Waiting(body, sender)
        if self._closed.is_set():
            return None
        try:
            self._queue.put_nowait(waiting)
        except queue.Full:
            return None
        if not waiting.done.wait(wait):
            return None  # posted late or never: sent directly too, which an idempotent batch allows
        return waiting.answer

    def close(self) -> None:
        """Stop listening; the node's ranks then post directly."""
        self._closed.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread: close alone would not
            self._listener.close()
        while True:  # those waiting now post directly
            try:
                self._answer([self._queue.get_nowait()], None)
            except queue.Empty:
                return

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                peer, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._peers.acquire(blocking=False):
                peer.close()  # too many: it posts directly
                continue
            threading.Thread(target=self._serve, args=(peer,), name="rankboard-relay-peer", daemon=True).start()

    def _serve(self, peer: socket.socket) -> None:
        try:
            with peer:
                if _peer_uid(peer) != os.getuid():
                    return
                while not self._closed.is_set() and self._answer_one(peer):
                    pass
        except (OSError, ValueError):
            pass  # a peer that went away or spoke nonsense: its connection ends, nothing else
        finally:
            self._peers.release()

    def _answer_one(self, peer: socket.socket) -> bool:
        """Read one request, relay it, send its answer; False when the peer is done (or refused)."""
        peer.settimeout(None)  # a rank's connection idles between its posts
        head = _read(peer, _REQUEST.size, first=True)
        if head is None:
            return False
        peer.settimeout(FRAME_S)
        token_length, body_length = _REQUEST.unpack(head)
        if token_length > MAX_TOKEN_BYTES or body_length > MAX_BODY_BYTES:
            raise ValueError("frame too large")
        token, body = _read(peer, token_length), _read(peer, body_length)
        if token is None or body is None:
            return False
        if not hmac.compare_digest(token, self._spot.token):
            _send_answer(peer, (DIRECT, "refused: not this run's token", b""))
            return False
        answer = self.post(body, sender=peer)
        _send_answer(peer, answer if answer is not None else (DIRECT, "busy", b""))
        return True

    def _forward(self) -> None:
        while not self._closed.is_set():
            gathered = self._gather()
            try:
                self._send(gathered)
            except Exception as error:  # the relay must outlive its own bugs: said once, its ranks post directly
                if not self._failed:
                    print(f"rankboard: relay error, carrying on: {error!r}", file=sys.stderr, flush=True)
                self._failed = True
            finally:
                self._answer([waiting for waiting in gathered if not waiting.done.is_set()], None)

    def _gather(self) -> list[_Waiting]:
        """The batches that arrive from the first on, for one window or until every local rank sent one."""
        gathered = [self._queue.get()]
        deadline = time.monotonic() + self._window
        while len({id(waiting.sender) for waiting in gathered}) < self._spot.local_world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                gathered.append(self._queue.get(timeout=left))
            except queue.Empty:
                break
        return gathered

    def _send(self, gathered: list[_Waiting]) -> None:
        bodies: list[dict[str, Any] | None] = [_decoded(waiting.body) for waiting in gathered]
        for waiting, body in zip(gathered, bodies, strict=True):
            if body is None:  # not a batch: the server says what is wrong with it, to that rank alone
                self._answer([waiting], self._post_counted(waiting.body))
        decoded = [(waiting, body) for waiting, body in zip(gathered, bodies, strict=True) if body is not None]
        for group in merged([body for _, body in decoded]):
            members = [decoded[index][0] for index in group.members]
            answer = self._post_counted(json.dumps(group.body, separators=(",", ":")).encode())
            if len(members) > 1 and answer[0] is not None and answer[0] >= 400 and answer[0] not in _NOT_NOW:
                for waiting in members:  # whose batch it was, each one's own answer says
                    self._answer([waiting], self._post_counted(waiting.body))
            else:
                self._answer(members, answer)

    def _post_counted(self, body: bytes) -> Answer:
        self.posts += 1
        return self._post(body)

    @staticmethod
    def _answer(members: list[_Waiting], answer: Answer | None) -> None:
        for waiting in members:
            waiting.answer = answer
            waiting.done.set()


@dataclass
class Group:
    """Batches that go to the server as one: `body` is the merged batch, `members` the indexes of its parts."""

    body: dict[str, Any] = field(default_factory=lambda: {"points": [], "columns": []})
    members: list[int] = field(default_factory=list)
    size: int = 0
    ranks: int = 0


def merged(bodies: list[dict[str, Any]]) -> list[Group]:
    """The batches as few batches as the server takes: each within MAX_POINTS_PER_BATCH points and
    MAX_RANKS_PER_BATCH heartbeats and endings; two that say different progress or node inventory go apart."""
    groups: list[Group] = []
    for index, body in enumerate(bodies):
        group = next((group for group in groups if _fits(group, body)), None)
        if group is None:
            group = Group()
            groups.append(group)
        _add(group, index, body)
    for group in groups:
        group.body = {key: value for key, value in group.body.items() if value or key == "points"}
    return groups


def _size(body: dict[str, Any]) -> int:
    return len(body.get("points") or ()) + sum(len(column.get("steps") or ()) for column in body.get("columns") or ())


def _ranks(body: dict[str, Any]) -> int:
    singular = (body.get("heartbeat") is not None) + (body.get("ended") is not None)
    return singular + len(body.get("heartbeats") or ()) + len(body.get("endings") or ())


def _fits(group: Group, body: dict[str, Any]) -> bool:
    if group.size + _size(body) > wire.MAX_POINTS_PER_BATCH or group.ranks + _ranks(body) > wire.MAX_RANKS_PER_BATCH:
        return False
    return all(body.get(key) is None or group.body.get(key, body[key]) == body[key] for key in ("progress", "node"))


def _add(group: Group, index: int, body: dict[str, Any]) -> None:
    merged_body = group.body
    merged_body["points"] += body.get("points") or []
    merged_body["columns"] += body.get("columns") or []
    for one, many in (("heartbeat", "heartbeats"), ("ended", "endings")):
        listed = merged_body.setdefault(many, [])
        listed += body.get(many) or []
        if body.get(one) is not None:
            listed.append(body[one])
    for key in ("progress", "node"):
        if body.get(key) is not None:
            merged_body[key] = body[key]
    group.members.append(index)
    group.size += _size(body)
    group.ranks += _ranks(body)


def _decoded(body: bytes) -> dict[str, Any] | None:
    """The batch, if it is one the relay can merge; None for anything else, which goes to the server as it came."""
    try:
        decoded = json.loads(body)
    except ValueError:
        return None
    if not isinstance(decoded, dict):
        return None
    lists = [decoded.get(key, []) for key in ("points", "columns", "heartbeats", "endings")]
    if not all(isinstance(listed, list) for listed in lists):
        return None
    columns = lists[1]
    return decoded if all(isinstance(c, dict) and isinstance(c.get("steps", []), list) for c in columns) else None


class RelayClient:
    """A rank's side: sends its batches to its node's relay over one kept connection."""

    def __init__(self, spot: Spot) -> None:
        self._spot = spot
        self._socket: socket.socket | None = None
        self._retry_at = 0.0

    def post(self, body: bytes) -> Answer | None:
        """The server's answer to this batch, relayed; None: the relay cannot be used now, post it directly."""
        if time.monotonic() < self._retry_at:
            return None
        try:
            self._connect()
        except OSError:
            self.close()
            return None  # no relay (yet): asking again at the next post costs one refused connect
        try:
            answer = self._exchange(body)
        except (OSError, ValueError):
            answer = None
        if answer is None or answer[0] == DIRECT:
            self.close()
            self._retry_at = time.monotonic() + RETRY_S
            return None
        return (None if answer[0] == NO_ANSWER else answer[0]), answer[1], answer[2]

    def _connect(self) -> None:
        if self._socket is None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._socket.settimeout(ANSWER_S + 3)
            self._socket.connect(self._spot.address)

    def _exchange(self, body: bytes) -> Answer | None:
        assert self._socket is not None
        self._socket.sendall(_REQUEST.pack(len(self._spot.token), len(body)) + self._spot.token + body)
        head = _read(self._socket, _ANSWER.size)
        if head is None:
            return None
        status, detail_length, reply_length = _ANSWER.unpack(head)
        detail, reply = _read(self._socket, detail_length), _read(self._socket, reply_length)
        if detail is None or reply is None:
            return None
        return status, detail.decode(errors="replace"), reply

    def close(self) -> None:
        """Drop the connection; the next post opens a new one."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _send_answer(peer: socket.socket, answer: Answer) -> None:
    status, detail, reply = answer
    line = detail.encode()[:1000]
    code = NO_ANSWER if status is None else status
    peer.sendall(_ANSWER.pack(code, len(line), len(reply)) + line + reply)


def _read(connection: socket.socket, length: int, *, first: bool = False) -> bytes | None:
    """Exactly `length` bytes; None if the peer closed first (at a frame's start, `first`, that is a goodbye)."""
    chunks, left = [], length
    while left:
        chunk = connection.recv(min(left, 1 << 20))
        if not chunk:
            if first and left == length:
                return None
            raise ValueError("connection closed mid-frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _peer_uid(peer: socket.socket) -> int:
    """The user id of the process at the other end: a relay serves its own user's processes only."""
    _pid, uid, _gid = struct.unpack("3i", peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return int(uid)
