"""The built-in trainer with a probe, for bench/trainer_speed.py: where a run's time goes, reporting on or off.

torchrun ... -m bench.trainer_probe <the trainer's own arguments>   (rank 0 prints one `[probe] {json}` line at the end)

On rank 0 it records each step's wall time (between heartbeats, which every rank calls once a step, on or off alike),
the reporter's posts (start and end), the garbage collector's time by generation, and the CPU time of the main thread,
the reporter's thread and the sampler's thread (each taken by the thread itself as it ends). Each step's main-thread
CPU time beside its wall time tells work the loop does itself from waiting (for the GIL, or for a core another
process took).
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from rankboard import wire

# The client makes its reporter, and starts its thread, when imported inside a run: hide the run while importing it,
# so that the thread is made after its method is wrapped below (then on the first report, as the client also does).
_run_id = os.environ.pop(wire.ENV_RUN_ID, None)
from rankboard import gpu, report  # noqa: E402

from trainer.train import main as train  # noqa: E402

if _run_id is not None:
    os.environ[wire.ENV_RUN_ID] = _run_id

beats: list[float] = []
beats_cpu: list[float] = []  # the main thread's CPU time at each heartbeat
posts: list[tuple[float, float]] = []
gc_ms = [0.0, 0.0, 0.0]
cpu_s: dict[str, float] = {}


def timed_posts(post: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return post(*args, **kwargs)
        finally:
            posts.append((started, time.perf_counter()))

    return wrapper


def thread_cpu(name: str, run: Callable[[Any], None]) -> Any:
    def wrapper(self: Any) -> None:
        try:
            run(self)
        finally:
            cpu_s[name] = cpu_s.get(name, 0.0) + time.thread_time()

    return wrapper


def heartbeat(step: int, beat: Callable[[int], None] = report.heartbeat) -> None:
    beats.append(time.perf_counter())
    beats_cpu.append(time.thread_time())
    beat(step)


def on_gc(phase: str, info: dict[str, int], started: list[float] = [0.0]) -> None:  # noqa: B006 - the callback's state
    if phase == "start":
        started[0] = time.perf_counter()
    elif beats:  # only in the training loop
        gc_ms[info["generation"]] += (time.perf_counter() - started[0]) * 1e3


def summary() -> dict[str, Any]:
    """Steps in ms, of wall time and of the main thread's CPU time: the median of all, and of those during which a
    post was under way ("busy") or not ("quiet")."""
    steps = list(itertools.pairwise(beats))
    busy = [any(s < b and e > a for s, e in posts) for a, b in steps]

    def medians(name: str, times: list[float]) -> dict[str, Any]:
        ms = [(b - a) * 1e3 for a, b in itertools.pairwise(times)]
        during = [m for m, is_busy in zip(ms, busy, strict=True) if is_busy]
        quiet = [m for m, is_busy in zip(ms, busy, strict=True) if not is_busy]
        return {
            f"{name}_ms": statistics.median(ms),
            f"busy_{name}_ms": statistics.median(during) if during else None,
            f"quiet_{name}_ms": statistics.median(quiet) if quiet else None,
        }

    return {
        "steps": len(steps),
        "busy_steps": sum(busy),
        **medians("step", beats),
        **medians("cpu", beats_cpu),
        "posts": len(posts),
        "post_s": sum(e - s for s, e in posts),
        "gc_ms": gc_ms,
        "cpu_s": cpu_s | {"main": time.thread_time()},
    }


def main() -> int:
    report.heartbeat = heartbeat
    report.Reporter._post = timed_posts(report.Reporter._post)  # type: ignore[method-assign]
    report.Reporter._run = thread_cpu("reporter", report.Reporter._run)  # type: ignore[method-assign]
    gpu.GpuSampler._run = thread_cpu("sampler", gpu.GpuSampler._run)  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    code = train(sys.argv[1:])
    if os.environ.get("RANK", "0") == "0":
        print("[probe] " + json.dumps(summary()), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
