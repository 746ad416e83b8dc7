"""How much `Reporter.log` costs the training loop.

    .venv/bin/python bench/log_call.py [--calls 200000] [--repeats 20]

Prints the median nanoseconds per `log({"loss": x, "lr": y}, step=s)` call (1) with the reporter's thread not
started, the cost the loop itself pays, beside a bare loop that appends the same two tuples to a deque (the floor),
and the other shapes a script logs (no step, nested, numpy and torch scalars), each with its quartiles; (2) with the
thread running against a closed port, so that it spools everything to disk while the loop logs, competing for the
GIL. Then steps per second of the mlp workload's loop (one process, no DDP) with and without a reporter,
alternating to even out drift.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from collections import deque
from typing import Any

import numpy as np
import torch
from rankboard import wire
from rankboard.report import Reporter

from trainer.workloads import WORKLOADS


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def ns_per_call(reporter: Reporter, calls: int) -> float:
    log = reporter.log
    started = time.perf_counter_ns()
    for step in range(calls):
        log({"loss": 0.5, "lr": 1e-3}, step=step)
    return (time.perf_counter_ns() - started) / calls


def floor_ns_per_call(calls: int) -> float:
    """What log()'s flat path does at the least: two tuples into a deque, with the dict and the time it needs."""
    points: deque[tuple[str, int, float, float, None]] = deque()
    append = points.append
    started = time.perf_counter_ns()
    for step in range(calls):
        now = time.time()
        for key, value in {"loss": 0.5, "lr": 1e-3}.items():
            append((key, step, value, now, None))
    return (time.perf_counter_ns() - started) / calls


# What scripts log besides a flat dict of floats with a step, two values a call like the flat one.
SHAPES: dict[str, tuple[dict[str, Any], bool]] = {
    "flat floats, step=s": ({"loss": 0.5, "lr": 1e-3}, True),
    "flat floats, no step": ({"loss": 0.5, "lr": 1e-3}, False),
    "nested {train: {loss, lr}}": ({"train": {"loss": 0.5, "lr": 1e-3}}, True),
    "ints": ({"tokens": 4096, "epoch": 3}, True),
    "numpy float32": ({"loss": np.float32(0.5), "lr": np.float32(1e-3)}, True),
    "torch 0-d CPU tensors": ({"loss": torch.tensor(0.5), "lr": torch.tensor(1e-3)}, True),
}


def shape_ns_per_call(metrics: dict[str, Any], with_step: bool, calls: int, spool_dir: str) -> float:
    log = Reporter(closed_port_url(), "bench", "token", spool_dir, start=False).log
    started = time.perf_counter_ns()
    for step in range(calls):
        if with_step:
            log(metrics, step=step)
        else:
            log(metrics)
    return (time.perf_counter_ns() - started) / calls


def print_shapes(calls: int, repeats: int, spool_dir: str) -> None:
    """Each shape's median ns/call and quartiles, interleaved with the floor so that drift hits all alike."""
    costs: dict[str, list[float]] = {name: [] for name in ["bare loop (floor)", *SHAPES]}
    for _ in range(repeats):
        costs["bare loop (floor)"].append(floor_ns_per_call(calls))
        for name, (metrics, with_step) in SHAPES.items():
            costs[name].append(shape_ns_per_call(metrics, with_step, calls, spool_dir))
    floor = statistics.median(costs["bare loop (floor)"])
    for name, values in costs.items():
        low, median, high = statistics.quantiles(values, n=4)
        print(f"  {name:28} median {median:5.0f} ns/call (quartiles {low:.0f}-{high:.0f}), "
              f"{median / floor:.2f}x the floor")  # fmt: skip


def median_ns_per_call(calls: int, repeats: int, *, start: bool, spool_dir: str) -> float:
    """Median over `repeats` fresh reporters, so the queue never grows beyond one repeat's points."""
    costs = []
    for _ in range(repeats):
        reporter = Reporter(closed_port_url(), "bench", "token", spool_dir, start=start)
        costs.append(ns_per_call(reporter, calls))
        if start:
            reporter.close(timeout=60)
    return statistics.median(costs)


def steps_per_s(steps: int, reporter: Reporter | None) -> float:
    workload = WORKLOADS["mlp"]
    inputs, targets = (t[:64] for t in workload.build_data()[0].tensors)
    torch.manual_seed(0)
    model = workload.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    started = time.perf_counter()
    for step in range(1, steps + 1):
        loss = workload.loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if reporter is not None:
            reporter.log({"loss": loss.item(), "lr": 1e-3}, step=step)
            reporter.progress(wire.Progress(epoch=1, epochs=1, step=step, total_steps=steps))
    return steps / (time.perf_counter() - started)


def compare_loops(steps: int, trials: int, spool_dir: str) -> tuple[list[float], list[float]]:
    """Steps/s of each trial, without and with a reporter whose thread runs and spools."""
    without: list[float] = []
    with_reporter: list[float] = []
    for _ in range(trials):
        without.append(steps_per_s(steps, None))
        reporter = Reporter(closed_port_url(), "bench", "token", spool_dir)
        with_reporter.append(steps_per_s(steps, reporter))
        reporter.close(timeout=60)
    return without, with_reporter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=300, help="training steps per loop trial")
    parser.add_argument("--trials", type=int, default=11, help="loop trials with and without a reporter")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as torchrun sets it for each of several ranks on one machine
    with tempfile.TemporaryDirectory() as spool_dir:
        idle = median_ns_per_call(args.calls, args.repeats, start=False, spool_dir=spool_dir)
        print(f"log(): median {idle:.0f} ns/call, thread not started ({args.repeats} x {args.calls:,} calls)")
        print(f"log() by shape, thread not started ({max(5, args.repeats // 2)} x {args.calls // 4:,} calls):")
        print_shapes(args.calls // 4, max(5, args.repeats // 2), spool_dir)
        busy = median_ns_per_call(args.calls, max(3, args.repeats // 4), start=True, spool_dir=spool_dir)
        print(f"log(): median {busy:.0f} ns/call, thread running and spooling (server unreachable)")
        # Other processes on a small machine swing single trials by 30%: the best trial is the steadier measure.
        without, with_reporter = compare_loops(args.steps, args.trials, spool_dir)
        for name, rates in (("without a reporter", without), ("with a reporter", with_reporter)):
            print(
                f"mlp loop, batch 64, 1 thread, {name}: median {statistics.median(rates):.0f} steps/s, "
                f"best {max(rates):.0f}"
            )
        print(f"best with / best without: {100 * (max(with_reporter) / max(without) - 1):+.1f}%")


if __name__ == "__main__":
    main()
