"""Which rank, and why: what a rank tells the dashboard about itself when asked, standard library only at import.

`take_dump` runs in the reporter's thread (rankboard/report.py) when the server's reply asks for a dump: the main
thread may be blocked in a gloo or NCCL collective, which releases the GIL, so this thread can read its stack. torch
is not imported here: only where the training already imported it is its flight recorder read.

The ranks answer at different moments (each at its next post), so one rank's sequence number next to another's says
nothing about who waits for whom: a healthy rank 1.3 s later is hundreds of collectives further. After its stack each
rank therefore watches, for a few seconds, whether its collectives or its step still move on (`Watch`); the server
names a culprit only from ranks that did not, seen at one moment (app/services/forensics.py).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import wire

WATCH_POLL_S = 0.05  # two counter reads a poll: nothing the training thread feels


@dataclass(frozen=True)
class Watch:
    """How a rank watches itself after its stack is taken: whether its collectives or its step still move on."""

    step: Callable[[], int | None] = lambda: None  # its newest step: the reporter's heartbeat step
    # At most this long; it stops at the first move, so only a rank that stands still waits it out, and its answer
    # is sent after. The reporter passes twice its heartbeat interval: every rank answers within one interval of the
    # request, so the watches of ranks that stand still share a moment, with an interval to spare.
    seconds: float = 0.0
    closing: Callable[[], bool] = lambda: False  # stop early: the process is ending


def take_dump(request: int, *, rank: int, host: str, watch: Watch = Watch()) -> wire.RankDump:
    """This process's stacks and flight recorder now, and whether it moved on after, for dump request `request`."""
    taken_at, started = time.time(), time.monotonic()
    first = (collective_seq(), watch.step())
    stack, threads = main_stack(), all_threads()
    collectives, recorder_error = flight_recorder()
    watched_s, moved = watch_progress(first, watch, started=started)
    return wire.RankDump(
        request=request,
        rank=rank,
        host=host,
        pid=os.getpid(),
        taken_at=taken_at,
        stack=stack,
        threads=threads,
        collectives=collectives,
        recorder_error=recorder_error,
        step=first[1],
        watched_s=watched_s,
        moved=moved,
    )


def watch_progress(
    first: tuple[int | None, int | None], watch: Watch, *, started: float
) -> tuple[float | None, bool | None]:
    """For how long since `started` this rank was watched, and whether its (collective, step) moved on from `first`;
    (None, None) when it has neither or is not to be watched."""
    if first == (None, None) or watch.seconds <= 0:
        return None, None
    while time.monotonic() - started < watch.seconds and not watch.closing():
        time.sleep(WATCH_POLL_S)
        if (collective_seq(), watch.step()) != first:
            return round(time.monotonic() - started, 3), True
    return round(time.monotonic() - started, 3), False


def collective_seq() -> int | None:
    """How many collectives this process issued in its default process group; None outside one.

    A counter read, cheap to poll: reading the flight recorder instead took ~40 ms, and ten reads a second slowed the
    training thread's all-reduces by 80% (gloo, 2 ranks). A private torch API, guarded."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.distributed.is_initialized():
            return None
        return int(torch.distributed.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:  # missing in this torch or backend, or the group is being torn down
        return None


def main_stack() -> tuple[wire.Frame, ...]:
    """The main thread's stack, most recent call first, at most wire.MAX_DUMP_FRAMES frames."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return ()
    summary = traceback.extract_stack(frame)[::-1][: wire.MAX_DUMP_FRAMES]
    return tuple(wire.Frame(entry.filename, entry.lineno or 0, entry.name) for entry in summary)


def all_threads() -> str:
    """Every thread's stack as faulthandler prints it (it needs a real file, not a StringIO)."""
    with tempfile.TemporaryFile("w+") as file:
        faulthandler.dump_traceback(file, all_threads=True)
        file.seek(0)
        return file.read(wire.MAX_DUMP_BYTES // 2)


def flight_recorder() -> tuple[tuple[wire.Collective, ...], str | None]:
    """The newest collectives of the flight recorder, oldest first; or why there are none.

    A private torch API (torch >= 2.5), guarded: it records only with TORCH_FR_BUFFER_SIZE set, which the launcher
    gives every rank."""
    torch = sys.modules.get("torch")
    if torch is None:
        return (), "torch is not imported in this process"
    try:
        raw = torch._C._distributed_c10d._dump_fr_trace_json()
        entries: list[dict[str, Any]] = json.loads(raw).get("entries") or []
    except Exception as error:  # missing in this torch, no process group yet, a format it changed
        return (), f"no flight recorder: {type(error).__name__}: {error}"[:300]
    if not entries:
        return (), "the flight recorder holds no collective (TORCH_FR_BUFFER_SIZE unset, or none ran yet)"
    return tuple(_collective(entry) for entry in entries[-wire.MAX_DUMP_COLLECTIVES :]), None


def _collective(entry: dict[str, Any]) -> wire.Collective:
    sizes = str(entry.get("input_sizes", ""))[:200]
    return wire.Collective(int(entry.get("collective_seq_id", 0)), str(entry.get("profiling_name", "?")), sizes)
