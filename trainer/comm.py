"""How much of each step waits on the gradient all-reduce: a DDP communication hook that times every bucket.

DDP all-reduces each gradient bucket as soon as backward has filled it, overlapping communication with the rest of
backward; `backward()` returns only once every bucket's all-reduce is done. So the communication a step *waits* on
(exposed) is the time from the last bucket becoming ready (backward's arithmetic is over) to the last all-reduce
completing; the rest of the all-reduce time hid behind backward. The hook does what DDP's own does (average, then
all-reduce: `default_hooks.allreduce_hook`) and notes the times; backward and the optimizer are timed around their
calls. `RANKBOARD_COMM_TIMING=0` in a rank's environment leaves DDP's built-in all-reduce alone (for comparisons).
"""

# No `from __future__ import annotations`: DDP checks a comm hook's annotations as objects, not strings.
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

ENV_COMM_TIMING = "RANKBOARD_COMM_TIMING"
# What `take_ms` returns, per step over the steps since it last did, as each rank's points.
KEYS = ("rank/comm_ms", "rank/allreduce_ms", "rank/backward_ms", "rank/optimizer_ms", "rank/buckets")


class CommTimer:
    """Each bucket's all-reduce, and backward and optimizer time, summed until `take_ms`."""

    def __init__(self) -> None:
        self.enabled = False
        self._lock = threading.Lock()  # completions run on the backend's thread
        self._reset()

    def _reset(self) -> None:
        self.exposed_s = self.allreduce_s = self.backward_s = self.optimizer_s = 0.0
        self.buckets = self.steps = 0
        self._last_ready = self._last_done = 0.0

    def attach(self, model: DistributedDataParallel, environ: Any = os.environ) -> None:
        """Register the timing hook on the model, unless RANKBOARD_COMM_TIMING=0."""
        if environ.get(ENV_COMM_TIMING, "1") == "0":
            return
        model.register_comm_hook(None, self.hook)
        self.enabled = True

    def hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's own averaging all-reduce of one bucket, timed from its launch to its completion."""
        launched = time.perf_counter()
        self._last_ready = launched
        self.buckets += 1
        future = default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]  # None: the default group

        def done(result: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            finished = time.perf_counter()
            with self._lock:
                self.allreduce_s += finished - launched
                self._last_done = max(self._last_done, finished)
            return result.value()

        return future.then(done)

    @contextlib.contextmanager
    def backward(self) -> Iterator[None]:
        """Time one backward pass; the all-reduces it waited on after its arithmetic count as exposed."""
        started = time.perf_counter()
        self._last_ready = self._last_done = 0.0
        yield
        ended = time.perf_counter()
        self.backward_s += ended - started
        if self._last_ready:
            with self._lock:
                self.exposed_s += max(0.0, min(self._last_done, ended) - self._last_ready)

    @contextlib.contextmanager
    def optimizer(self) -> Iterator[None]:
        """Time one optimizer step (unscale, clip, step, scheduler); counts the step."""
        started = time.perf_counter()
        yield
        self.optimizer_s += time.perf_counter() - started
        self.steps += 1

    def take_ms(self) -> list[float]:
        """KEYS' values per step since the last call (0 when the hook is off), and start counting afresh."""
        steps = max(self.steps, 1)
        values = [1000 * self.exposed_s / steps, 1000 * self.allreduce_s / steps, 1000 * self.backward_s / steps,
                  1000 * self.optimizer_s / steps, self.buckets / steps]  # fmt: skip
        self._reset()
        return values
