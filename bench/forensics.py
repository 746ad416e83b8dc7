"""Which rank, and why: how long a dump takes to show every rank, what the per-step checks cost, and how often the
straggler detector cries wolf.

.venv/bin/python -m bench.forensics [--dumps 5] [--pairs 5] [--even-runs 20]

1. Dump latency: a user script (tests/e2e/hang_script.py) hangs with rank 1 outside the all-reduce that rank 0 waits
   in; each dump is requested through the API and timed until the run page shows both ranks' rows.
2. Cost per step: the non-finite check is two math.isfinite() on the sums the step's all-reduce already returns, plus
   a closure; timed in a loop. The fingerprint: 2-rank mlp runs with --fingerprint-every 1 against 0, interleaved,
   medians; the cost of one check is the difference of step times, and at the default (every 100 steps) it is a
   hundredth of that per step.
3. False alarms: even 2-rank mlp runs through the dashboard (2 epochs, batch 256: 12 reports of each rank's times);
   each run's findings must list no straggler.

Last measured (this 2-core machine, shared with other work at a load of ~7, CPU, gloo, torch 2.13; --dumps 5
--pairs 5 --even-runs 10):
    dump latency, request to both ranks on the page: median 1.99 s (min 0.99, max 2.16, n=5): the reporters'
      2 s heartbeat interval, within which each idle reporter posts and so hears of the request, dominates
    non-finite check: 482 ns a step = 0.004% of an 11.4 ms step (no collective while the values are finite)
    fingerprint every step: 71.7 steps/s vs none 87.7 (medians of 5 alternated pairs): 2.5 ms a check; at the
      default of every 100 steps, 0.22% of a step
    straggler false alarms: 0 of 10 even runs (10 succeeded); 20 were not run for lack of time here
"""

from __future__ import annotations

import argparse
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from app.launcher import processes
from tests.live import REPO, LiveServer, run_processes, wait_for
from trainer import watch

RATE = re.compile(r"\[rank 0\] finished after \d+ steps, final loss [\d.na]+, ([\d.]+) steps/s")
HANG_SCRIPT = REPO / "tests" / "e2e" / "hang_script.py"
FINAL = {"succeeded", "failed", "stopped", "lost"}


def dump_latencies(root: Path, count: int) -> list[float]:
    """Seconds from POST /dumps to the run page showing both ranks, for `count` dumps of one hung run."""
    server = LiveServer(root, RANKBOARD_SLOTS="2", RANKBOARD_STALL_AFTER_S="3600")
    server.start()
    try:
        shutil.copy(HANG_SCRIPT, root / "shared" / "hang_script.py")
        with server.api() as api:
            run = api.post("/api/runs", json={"name": "bench", "nproc_per_node": 2, "script": "hang_script.py"}).json()
            wait_for(lambda: api.get(f"/api/runs/{run['id']}").json()["step"] >= 9, 120, what="the run to hang")
            time.sleep(3)  # rank 1 is in wait_for_data, rank 0 in all_reduce
            return [one_dump(api, run["id"]) for _ in range(count)]
    finally:
        server.stop()
        processes.kill_all(run_processes(root))


def one_dump(api: httpx.Client, run_id: int) -> float:
    started = time.perf_counter()
    request = api.post(f"/api/runs/{run_id}/dumps").json()["request"]

    def shown() -> bool | None:
        page = api.get(f"/runs/{run_id}").text
        both = f"Dump {request}," in page and '<tr data-rank="0"' in page and '<tr data-rank="1"' in page
        return True if both and "2 of 2 ranks answered" in page else None

    wait_for(shown, 30, interval=0.05, what="both ranks on the page")
    return time.perf_counter() - started


def check_cost_ns(calls: int = 1_000_000) -> float:
    """Nanoseconds of NonFiniteWatch.check on finite sums: what every step pays."""
    checker = watch.NonFiniteWatch(0, print)
    started = time.perf_counter_ns()
    for step in range(calls):
        checker.check(step, 0.5, 1.5, lambda: None)  # type: ignore[arg-type, return-value]
    return (time.perf_counter_ns() - started) / calls


def steps_per_s(tmp: Path, fingerprint_every: int) -> float:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "trainer",
        "--epochs", "1", "--checkpoint-every", "1000", "--fingerprint-every", str(fingerprint_every),
        "--checkpoint-dir", str(tmp / secrets.token_hex(4)),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    match = RATE.search(done.stdout)
    if match is None:
        raise RuntimeError(f"no rate in the output:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return float(match.group(1))


def fingerprint_pairs(tmp: Path, pairs: int) -> tuple[list[float], list[float]]:
    """Steps/s with a fingerprint every step and with none, alternated."""
    every, never = [], []
    for _ in range(pairs):
        every.append(steps_per_s(tmp, 1))
        never.append(steps_per_s(tmp, 0))
    return every, never


def false_alarms(root: Path, runs: int) -> tuple[int, int]:
    """(runs with a straggler flagged, runs that succeeded) over `runs` even runs."""
    server = LiveServer(root, RANKBOARD_SLOTS="2")
    server.start()
    flagged = succeeded = 0
    try:
        with server.api() as api:
            for _ in range(runs):
                spec = {"name": "even", "nproc_per_node": 2, "workload": "mlp", "epochs": 2, "batch_size": 256}
                run = api.post("/api/runs", json=spec).json()
                done = wait_for(lambda run_id=run["id"]: final(api, run_id), 300, what="the run to end")
                succeeded += done["status"] == "succeeded"
                flagged += bool(api.get(f"/api/runs/{run['id']}/findings").json()["stragglers"])
    finally:
        server.stop()
        processes.kill_all(run_processes(root))
    return flagged, succeeded


def final(api: httpx.Client, run_id: int) -> dict | None:
    run = api.get(f"/api/runs/{run_id}").json()
    return run if run["status"] in FINAL else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dumps", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--even-runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        latencies = dump_latencies(Path(tmp) / "dump", args.dumps)
        print(f"dump latency, request to both ranks on the page: median {statistics.median(latencies):.2f} s "
              f"(min {min(latencies):.2f}, max {max(latencies):.2f}, n={len(latencies)})", flush=True)  # fmt: skip
        cost = check_cost_ns()
        every, never = fingerprint_pairs(Path(tmp), args.pairs)
        step_ms = 1000 / statistics.median(never)
        per_check_ms = 1000 / statistics.median(every) - step_ms
        print(f"non-finite check: {cost:.0f} ns a step = {100 * cost / 1e6 / step_ms:.4f}% of a {step_ms:.2f} ms step")
        print(f"fingerprint every step: {statistics.median(every):.1f} steps/s vs none {statistics.median(never):.1f} "
              f"(medians of {args.pairs} alternated pairs): {per_check_ms:.3f} ms a check; every 100 steps: "
              f"{100 * per_check_ms / 100 / step_ms:.3f}% of a step", flush=True)  # fmt: skip
        if args.even_runs:
            flagged, succeeded = false_alarms(Path(tmp) / "even", args.even_runs)
            print(f"straggler false alarms: {flagged} of {args.even_runs} even runs ({succeeded} succeeded)")


if __name__ == "__main__":
    main()
