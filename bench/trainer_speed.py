"""Steps/s of each workload with 1 and 2 ranks, and what the dashboard's reporting costs a run.

.venv/bin/python -m bench.trainer_speed [--repeats 3] [--epochs 1]
.venv/bin/python -m bench.trainer_speed --part reporting --ranks 1 --repeats 20 [--client-from OLD_CHECKOUT]
    [--server-cpus 12-13 [--apart-only]] [--report-s 5] [--ingest-nice 19]

Every figure is the trainer's own "N steps/s" line (the training loop alone, from its first step to its last; not
torchrun's start-up). Reporting: the same 2-rank mlp run with the client posting to a live server (loss, lr, grad
norm, samples/s every step, rank times, heartbeats, CPU samples) against the same run outside a dashboard
(the client a no-op), interleaved so that drift hits both alike.

Last measured (this 2-core machine, CPU, gloo, torch 2.13; batch 64 per rank; medians of 3, 1 epoch):
    mlp     1 rank 544.5 steps/s (34,848 samples/s)   2 ranks 154.2 steps/s (19,738 samples/s)
    cnn     1 rank  99.0 steps/s  (6,336 samples/s)   2 ranks  49.2 steps/s  (6,298 samples/s)
    charlm  1 rank   9.1 steps/s    (582 samples/s)   2 ranks   5.1 steps/s    (653 samples/s, 41,792 tokens/s)
  Two ranks on two cores gain nothing here: each step's all-reduces go through gloo on the same two cores that
  compute (small models, so communication dominates; see the DDP checklist), and the torchrun agent takes its share.
  Reporting on/off, medians of 7 alternated 2-epoch runs: 2 ranks 171.3 vs 168.0 steps/s (median paired difference
  -2.3%, i.e. none measurable: runs vary +-10%); 1 rank 461.9 vs 476.4 (-3.0%, runs vary +-20%). The loop's own
  cost is 4 log() calls and a heartbeat per step, ~3 us against a 2-6 ms step (bench/log_call.py), i.e. < 0.2%.
  In about a third of the trials the first torchrun after a server start ran ~10x slower, with reporting on and off
  alike (not reproduced without a server, nor on later runs; unexplained); such runs are in the medians above.

On one H100 (torch 2.11 + CUDA 13, nccl, 1 rank; 2 ranks cannot share its one GPU), charlm bf16, batch 64, 3
epochs, 5 alternated pairs, with the per-point client of the time: reporting on 90.2 steps/s (369k tokens/s), off 99.6
(408k); median paired slowdown 7.1%, pairs from -10.7% to +14.4%. With the compact client (2026-11-23), 10 pairs of
3 epochs: on 90.7 steps/s, off 87.7; median paired slowdown -3.5%, i.e. nothing measurable against runs that vary
+-10% (1 epoch, 14 pairs: +3.1%, runs varying from 49 to 101 steps/s).

On the GPU node's 16 CPU cores (CUDA hidden, gloo, OMP_NUM_THREADS=2, points in chunks; 2026-11-23, one device
call each, cut short by its time limit): 1 rank, 9 pairs: on 244.2, off 272.0 steps/s, median paired slowdown
+13.3%, every pair slower. The probe (bench/trainer_probe.py) then found why: the reporter drained its queue to empty
at each tick, so it chased the loop with posts of a few steps each: 430 a run where one every half second makes 6,
twice the server's CPU over the run (2.7 s against 1.35 s) and 10x the reporter thread's (0.126 s against 0.012 s).
Fixed (2bd82d3), in the same conditions, 14
rounds, with the client before the fix as a third arm (--client-from): 1 rank on 461.6, before the fix 431.8, off
464.1 steps/s; median paired slowdown +0.6% (7 of 14 pairs slower; quartiles -7.6% and +5.4%), before the fix +8.1%
(13 of 14 slower). The fixed client's run: 6 posts, its thread 0.012 s of CPU, the sampler's 0.008 s; a step 1.990
ms, during a post 2.108 ms, otherwise 1.989 ms (off: 1.989 ms). 2 ranks, 20 rounds: on 304.1, off 319.0, +3.2% (13
of 20 slower; quartiles -6.3% and +9.6%, runs from 246 to 393 steps/s): 5 posts a run, each thread ~0.01 s of CPU,
a step during a post 3.491 ms against 3.085 otherwise, i.e. the posts account for ~0.1%; the rest is within the
runs' spread. Four benches at once, each on 4 cores of its own (taskset, OMP_NUM_THREADS=1): 1 rank -2.2% and
+0.8% (14 pairs each), 2 ranks -2.9% and -2.9% (15 and 14 pairs).

On this 2-core machine (OMP_NUM_THREADS=1; 2026-11-23, quiet, 2 epochs, 20 rounds, the server supervising at the
default 0.5 s: before, the bench's server ticked every 0.2 s as the tests' does): 1 rank on 596.1, off 610.5
steps/s, median paired slowdown -0.5% (8 of 20 rounds slower; quartiles -7.7% and +4.7%; runs from 461 to 680
steps/s): 8 posts a run, the server's CPU 0.26 s. 2 ranks on 192.4, off 197.4, +1.2% (12 of 20 slower;
quartiles -4.0% and +8.5%; runs from 137 to 236): 12 posts a run, the server's
CPU 0.67 s; here the ranks take both cores, so whatever the server does is taken from them: a step during a post
8.67 ms against 4.24 ms otherwise. That server CPU was inflated: each round left its run live, so every later tick
supervised one more. With each round's run ended (the same day, 20 rounds each): 2 ranks +4.1% (16 of 20 slower;
quartiles +1.1%, +8.5%), the server's CPU 0.20 s a run; with its ingest at nice 19, +7.6% (15 of 20; -0.9%, +10.1%),
so niceness does not help here; 1 rank +2.2% (14 of 20; -0.5%, +6.8%), the server's CPU 0.13 s. Between two sets of
20 rounds the median moved by 2.7 points (1 rank) and 2.9 (2 ranks): 20 rounds here do not resolve 1%.

With --ingest-nice 19, on this 2-core machine, quiet, 10 rounds of 1 epoch (2026-11-23): 1 rank on 503.7, niced
486.4, off 515.0 steps/s (paired +6.4%, +8.3%); 2 ranks on 158.2, niced 161.1, off 169.0 (+6.2%, +3.9%). Runs vary
+-15% here, so neither the cost nor the niceness's effect is resolved at 10 rounds.

Until 2026-11-25 these figures are suspect: tests/live.open_run created each "on" run through the API, queued, and
the server's supervisor could start a real 10-epoch torchrun for it before it was turned into the bench's run (seen
once in 25 runs opened here), training beside the rounds that followed. Fixed; on this 2-core machine that
day, 1 epoch, 20 rounds, the client still posting twice a second: 2 ranks on 92.5, off 102.4 steps/s,
+4.9% (14 of 20 slower; quartiles -1.3%, +13.9%), 12 posts a run, the server's CPU 0.50 s, a step 9.80 ms, during a
post 16.03 ms, otherwise 9.51 ms; 1 rank on 226.7, off 247.8, +9.0% (13 of 20; -11.2%, +18.4%), during a post 12.6
ms against 3.9 ms. An hour later, 20 rounds of four arms: on -1.0% (quartiles -6.7%, +12.0%); every thread of the
server at nice 19, +3.3% (-1.3%, +9.8%); the client posting once a second, +0.9% (-5.3%, +6.6%; 7 posts a run, the
server's CPU 0.41 s against 0.46 s). Reporting switched on and off in alternate blocks of 128 steps within each run,
so that drift between runs cancels, did no better: neighbouring blocks differ by +-10% here, and a known cost of 1%
(94 us a step) measured -2.2% over 70 pairs (quartiles -10.1%, +4.7%). On this machine 1% is below what any of
these resolves; bench/post_cost.py measures the server's side directly instead.

With the client posting once a second by default (the same machine, later that day, slower still: 1 rank ran 211
steps/s against 596 two days before), 1 epoch, 20 rounds: 1 rank on 211.9, off 211.2 steps/s, -3.0% (9 of 20
slower; quartiles -18.2%, +13.4%), 6 posts a run, the server's CPU 0.32 s; 2 ranks on 93.8, off 98.7, +7.4% (16 of
20 slower; quartiles +1.0%, +9.3%), 7 posts a run, the server's CPU 0.44 s (torchrun's start-up included), a step
9.69 ms, during a post 16.86 ms, otherwise 9.48 ms against 9.22 ms off. Two ranks fill both cores here, so all the
server does and both reporting threads are taken from them: ~0.2 ms a step of the 0.47 comes from the steps during
posts, the rest is spread over every step.

With the supervisor's statements built once (2026-11-26: a tick with one live run 5.3 ms -> 1.5 ms, bench/
supervisor_tick.py), the same machine, slower again (1 rank ~172 steps/s off), 1 epoch, 20 rounds: 2 ranks on 89.0,
off 90.7 steps/s, +2.3% (15 of 20 slower; quartiles -0.7%, +5.5%), 7 posts a run, the server's CPU 0.35 s (from
0.44), a step 10.83 ms, during a post 17.45 ms, otherwise 10.58 ms against 10.73 ms off: the steps away from posts
no longer pay (before: 9.48 against 9.22 ms), what is left sits in the steps during posts. 1 rank: on 178.8, off
171.6, -2.0% (9 of 20; -10.5%, +7.7%), the server's CPU 0.30 s, the reporter's and sampler's threads 0.03 s each.

With the ingest route asking FastAPI for only the run id and the token (2026-11-26, later; bench/post_cost.py: rank
0's post 12.36 -> 11.27 ms of server CPU), 1 epoch, 20 rounds, OMP_NUM_THREADS unset: 2 ranks on 98.8, off 105.3
steps/s, +1.5% (11 of 20 slower; quartiles -2.8%, +6.4%), 6 posts a run, the server's CPU 0.29 s (from 0.35), a step
9.26 ms, during a post 15.79 ms, otherwise 9.12 ms against 8.59 ms off. 1 rank on 232.0, off 250.8, +3.2% (10 of 20;
quartiles -22.8%, +26.2%: runs from 158 to 362 steps/s), the server's CPU 0.22 s, a step during a post 14.67 ms
against 4.01 ms otherwise: one rank's intra-op threads take both cores here, so the server's ~11 ms a post stalls them.
In both, what remains is the server's CPU taken from training's cores, not the reporter's thread (0.02 s a run).

On one H200 node (2026-11-26; torch 2.11 + CUDA 13, 16 cores; the client posting once a second): three benches at
once, each with its own server on cores of its own (taskset): mlp with 1 and with 2 ranks on the CPU (CUDA hidden,
gloo, OMP_NUM_THREADS=1, 4 cores each), and charlm in bf16 on the GPU (1 rank, nccl, 8 cores); two device calls
of 420 s and 300 s, their rounds pooled (the pairs are within a call):
    mlp, 1 rank, 23 rounds: on 375.8, off 400.8 steps/s, median paired slowdown +5.4% (18 of 23 slower; quartiles
        +0.1%, +8.1%); 4 posts a run; CPU of the reporter's thread 0.012-0.014 s a run, the sampler's 0.009-0.010 s,
        the server's 0.11-0.12 s; a step 2.46 ms, during a post 2.6-3.2 ms, otherwise 2.45 and 2.44 ms against
        2.41 and 2.27 ms off (per call).
    mlp, 2 ranks, 24 rounds: on 273.2, off 274.1, +2.0% (17 of 24; -1.8%, +6.0%); 3-4 posts, the server's CPU
        0.12-0.15 s; a step during a post 5.4-5.6 ms against 3.6-3.8 otherwise, 3.5-3.7 off.
    charlm bf16 on the GPU, 21 rounds: on 95.4, off 96.2 steps/s (~390k tokens/s), +1.7% (12 of 21; -5.5%,
        +9.5%; pairs from -21% to +40%: nothing resolved); 4 posts, the server's CPU 0.10-0.12 s; a step 8.0-8.2 ms,
        during a post 9.3-9.5 ms.
  So 1% is not met on the node's CPU with 1 rank: the run loses ~0.13 s of a ~2.7 s loop. The client's two threads
  take 0.02 s of CPU over it; the server takes 0.11-0.12 s (an idle server ~4 ms/s, so ~0.1 s of it is the run's:
  its posts and the supervisor's ticks with a live run), on cores of the same four. Those figures point at the
  server, not the loop.

The probe now also prints the main thread's CPU time a step. On this 2-core machine (the same day, 1 rank,
OMP_NUM_THREADS=1, 18 rounds: on 272.4, off 275.1 steps/s, +0.4%, quartiles -17.1%, +15.2%): a step during a post
4.24 ms of wall time and 3.88 ms of the main thread's CPU, otherwise 3.39 and 3.21 ms, off 3.37 and 3.18 ms. So during
a post the loop's own CPU time grows by nearly as much as its wall time (+0.67 of +0.85 ms): it runs slower while
the server ingests on the other core, rather than waiting for the reporter's hold of the GIL (waiting costs no CPU).
The next GPU node should run this bench again to see whether the same holds there.

With the ranks posting every 5 s as a third arm (--report-s 5, RANKBOARD_REPORT_S; this 2-core machine, 2026-11-26, 2
ranks, 1 epoch, 20 rounds): on 94.8, posting every 5 s 96.4, off 97.4 steps/s; median paired slowdowns +0.4% (10
of 20 slower; quartiles -6.7%, +7.8%) and +2.9% (13 of 20; -2.7%, +12.9%): neither resolved. The server's CPU over a
run: 0.31 s, 0.21 s, and 0.08 s idle (off), so the run's own cost to it fell from 0.23 to 0.13 s (7 posts to 3).

On one H100 node (2026-11-26; torch 2.11 + CUDA 13, 16 cores, no SMT; the client posting once a second), benches at
once, each with its own servers on 4 cores of its own (taskset; OMP_NUM_THREADS=1 on the CPU, 2 for the GPU's):
    first call (400 s), on and off:
    mlp, 1 rank, CPU, 11 rounds: on 352.8, off 366.3 steps/s, +5.4% (9 of 11 slower; quartiles +0.5%, +8.4%); 4
        posts a run; the reporter's thread 0.015 s of CPU, the sampler's 0.010 s, the server's 0.170 s (0.050 s idle);
        a step 2.462 ms, during a post 3.058 ms, otherwise 2.459 against 2.389 ms off; of the main thread's CPU
        2.373, 2.751, 2.366 against 2.265 ms.
    mlp, 2 ranks, CPU, 11 rounds: on 227.6, off 240.8, +4.0% (8 of 11; -0.1%, +10.2%); a step during a post 6.295
        ms, otherwise 3.924 against 3.828 off.
    charlm bf16 on the GPU, 10 rounds: on 79.7, off 81.2, +5.6% (7 of 10; -4.1%, +10.1%); a step during a post
        12.038 ms, otherwise 9.791 against 9.478 off.
    mlp, 1 rank, 5 rounds of four arms: on +3.9%, ingest at nice 19 +9.5%, posting every 5 s -7.0% (none resolved);
        at nice 19 a step during a post 3.226 ms against 2.644 otherwise: the cores were not full, so niceness had
        nothing to give.
    second call (315 s), each bench with a third arm whose server keeps to 2 cores apart (every thread of it pinned
    from the bench, as RANKBOARD_SERVER_CPUS, which came of this, now does itself), 5 rounds:
    mlp, 1 rank: a step during a post: on 3.142 ms against 2.529 otherwise; apart 2.515 against 2.503; off 2.470.
        Paired: on -4.2%, apart +2.1% (4 of 5 slower; quartiles +0.6%, +3.8%): not resolved.
    mlp, 2 ranks: during a post on 6.185 against 3.898 ms, apart 4.619 against 4.121; off 4.063 (paired +0.1%,
        -0.9%).
    charlm bf16: on -9.2%, apart -8.4% against off; steps during posts 10.563 and 12.013 ms: nothing resolved.
  So on the node's CPU, a step that overlaps a post costs ~0.6 ms more (+24%) with the server on the run's cores, and
  nothing with it on cores apart (RANKBOARD_SERVER_CPUS). What remains with the server apart is ~1% on every step
  (2.503 against 2.470 ms), in the run's own process, not resolved by 5 rounds. On the GPU, charlm's steps vary too
  much between runs to resolve either.

On one H200 node (2026-11-26; torch 2.11 + CUDA 13, 16 cores; the client posting once a second), the server on cores
apart as a node should run it (--server-cpus, --apart-only: on against off alone), two benches at once, one device
call of 500 s: mlp with 1 rank on the CPU (CUDA hidden, gloo, OMP_NUM_THREADS=1, the bench on cores 0-5, its server
on 6-7) and charlm in bf16 on the GPU (1 rank, nccl, OMP_NUM_THREADS=2, cores 8-13, its server on 14-15):
    mlp, 1 rank, 15 rounds: on 356.7, off 346.8 steps/s, median paired slowdown +0.3% (8 of 15 slower; quartiles
        -11.5%, +13.3%; runs drifted from ~400 to ~270 steps/s over the call); 4 posts a run; the reporter's thread
        0.014 s of CPU, the sampler's 0.010 s, the server's 0.140 s (0.050 s idle); a step 2.836 ms, during a post
        3.448 ms, otherwise 2.832 ms; of the main thread's CPU 2.602, 3.155, 2.577 ms.
    charlm bf16 on the GPU, 14 rounds: on 87.2, off 81.7 steps/s, -2.8% (4 of 14 slower; quartiles -7.9%, +1.5%);
        4 posts; the reporter's thread 0.008 s, the sampler's 0.007 s, the server's 0.120 s; a step 9.394 ms,
        during a post 10.324 ms, otherwise 9.384 ms; of the main thread's CPU 5.008, 5.172, 5.005 ms.
  So with the server on cores of its own the median paired difference is within 1% on both. What the probe still
  sees is in the run's own process: a step during a post costs +0.6 ms (mlp) and +0.9 ms (charlm), with as much more
  of the main thread's CPU on the CPU run (the reporter's thread encoding and sending while the loop runs), and the
  mean step stands 0.14% (mlp) and 0.11% (charlm) above the steps away from posts. The rest of a pair's difference
  is the runs' spread, which 15 rounds do not resolve to 1%.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from rankboard import report, wire

from app.core import cpus
from app.core.models import RunStatus, utcnow
from app.core.settings import Settings
from tests.live import LiveServer, open_run, set_run

REPO = Path(__file__).resolve().parents[1]
SUPERVISE_INTERVAL_S = str(Settings.model_fields["supervise_interval_s"].default)
RATE = re.compile(r"\[rank 0\] finished after \d+ steps, final loss [\d.na]+, ([\d.]+) steps/s")


def train_once(
    tmp: Path,
    nproc: int,
    workload: str,
    epochs: int,
    env: dict[str, str],
    *extra: str,
    module: str = "trainer",
    cwd: Path | None = None,
) -> tuple[float, str]:
    """The run's steps/s, and its output."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", module, "--workload", workload, "--epochs", str(epochs), "--checkpoint-every", "1000",
        "--checkpoint-dir", str(tmp / secrets.token_hex(4)), *extra,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    match = RATE.search(done.stdout)
    if match is None:
        raise RuntimeError(f"no rate in the output:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return float(match.group(1)), done.stdout


def steps_per_s(tmp: Path, nproc: int, workload: str, epochs: int, env: dict[str, str]) -> float:
    return train_once(tmp, nproc, workload, epochs, env)[0]


def rank_counts() -> list[int]:
    """1 and 2 ranks; on a CUDA host only as many as it has GPUs (NCCL refuses two ranks on one GPU)."""
    if not torch.cuda.is_available():
        return [1, 2]
    counts = [n for n in (1, 2) if n <= torch.cuda.device_count()]
    if len(counts) < 2:
        print(f"only {torch.cuda.device_count()} GPU: 2 ranks skipped (NCCL refuses two ranks on one GPU)")
    return counts


def outside_dashboard() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith("RANKBOARD_")}


def workloads(tmp: Path, repeats: int, epochs: int) -> None:
    print("workload  ranks  steps/s (median)  samples/s")
    for workload, batch in (("mlp", 64), ("cnn", 64), ("charlm", 64)):
        for nproc in rank_counts():
            rates = [steps_per_s(tmp, nproc, workload, epochs, outside_dashboard()) for _ in range(repeats)]
            rate = statistics.median(rates)
            print(f"{workload:8}  {nproc:5}  {rate:16.1f}  {rate * batch * nproc:9.0f}", flush=True)


def reporting(tmp: Path, repeats: int, epochs: int, workload: str, options: argparse.Namespace, *extra: str) -> None:
    """The same run with the client on and off, alternated; with 1 rank a core is left to the reporter's thread and
    the server, as on a GPU node, with 2 ranks they compete with training for this machine's 2 cores.

    Each run goes through bench/trainer_probe.py, which says where a difference lies: the server's CPU time over the
    run, the reporter's posts and its thread's CPU time, and the steps during which a post was under way against
    the others. With --ingest-nice N an arm reports to a second server whose ingest threads run at niceness N; with
    --client-from DIR an arm runs the trainer package found in DIR (another version of the client, for an A/B); with
    --server-cpus an arm's server keeps to other CPUs than the bench's (RANKBOARD_SERVER_CPUS), which tells the
    server's share of the difference (its CPU taken from training's cores) from the client's. Stopped (Ctrl-C,
    SIGTERM), it reports the rounds it completed."""
    # The server as a user runs it: the tests' LiveServer supervises 2.5x as often as the default, which costs CPU.
    server = LiveServer(tmp / "server", RANKBOARD_SUPERVISE_INTERVAL_S=SUPERVISE_INTERVAL_S)
    arms: dict[str, tuple[LiveServer | None, dict[str, str]]] = {"on": (server, {})}
    if options.ingest_nice:
        niced = LiveServer(
            tmp / "niced",
            RANKBOARD_SUPERVISE_INTERVAL_S=SUPERVISE_INTERVAL_S,
            RANKBOARD_INGEST_NICE=str(options.ingest_nice),
        )
        arms[f"on, ingest nice {options.ingest_nice}"] = (niced, {})
    if options.client_from:
        arms[f"on, {options.client_from.name}"] = (server, {"PYTHONPATH": python_path(options.client_from.resolve())})
    if options.report_s:
        arms[f"on, posting every {options.report_s:g} s"] = (server, {report.ENV_REPORT_S: str(options.report_s)})
    apart = None
    if options.server_cpus:
        apart = LiveServer(tmp / "apart", RANKBOARD_SUPERVISE_INTERVAL_S=SUPERVISE_INTERVAL_S,
                           RANKBOARD_SERVER_CPUS=options.server_cpus)  # fmt: skip
        arms[f"on, server on CPUs {options.server_cpus}"] = (apart, {})
        if options.apart_only:  # the shared arm measured enough: every round to the arm a node should run
            del arms["on"]
            server = apart
    arms["off"] = (None, {})
    servers = {id(s): s for s, _env in arms.values() if s is not None}.values()
    every_cpu = frozenset(range(os.cpu_count() or 1))
    try:
        for each in servers:  # the apart one from every CPU: it refuses CPUs outside those it starts with (taskset's)
            with cpus.everywhere(every_cpu if each is apart else None):
                each.start()
        for nproc in options.ranks or rank_counts():
            runs: dict[str, list[Probed]] = {arm: [] for arm in arms}
            try:
                for round_ in range(repeats):
                    for arm in arms if round_ % 2 == 0 else reversed(arms):  # each arm goes first in half the rounds
                        watched = arms[arm][0] or server  # off: what the idle server takes meanwhile
                        runs[arm].append(probed_run(tmp, nproc, workload, epochs, *arms[arm], *extra, watched=watched))
                    print(f"  round {round_ + 1}: " + ", ".join(f"{a} {r[-1]}" for a, r in runs.items()), flush=True)
            except KeyboardInterrupt:
                print("  stopped: the rounds completed follow", flush=True)
            rounds = min(map(len, runs.values()))
            print(f"{workload} {' '.join(extra)}, {nproc} rank(s), {rounds} rounds, medians:")
            off = [r.rate for r in runs["off"][:rounds]]
            for arm, arm_runs in runs.items():
                rates = [r.rate for r in arm_runs[:rounds]]
                print(f"  {arm:20} {statistics.median(rates or [math.nan]):7.1f} steps/s, paired slowdown "
                      f"{paired_slowdown(rates, off)}; " + Probed.medians(arm_runs[:rounds]))  # fmt: skip
    finally:
        for each in servers:
            each.stop()


def paired_slowdown(rates: list[float], off: list[float]) -> str:
    """The median of the rounds' slowdowns against the off arm, how many were slower, and the quartiles."""
    if len(rates) < 2:
        return "n/a (fewer than 2 rounds)"
    slowdowns = [100 * (1 - a / b) for a, b in zip(rates, off, strict=True)]
    low, _, high = statistics.quantiles(slowdowns, n=4)
    slower = sum(s > 0 for s in slowdowns)
    return (f"{statistics.median(slowdowns):+.1f}% ({slower} of {len(slowdowns)} rounds slower; "
            f"quartiles {low:+.1f}%, {high:+.1f}%)")  # fmt: skip


THREADS = ("reporter", "sampler")


@dataclass
class Probed:
    """One run's steps/s and what bench/trainer_probe.py saw; times in seconds unless named ms."""

    rate: float
    probe: dict[str, Any]
    server_cpu: float  # the server process's CPU time over the run (off: the same server, idle)

    def __str__(self) -> str:
        return f"{self.rate:.1f} ({self.probe['posts']} posts)"

    @staticmethod
    def medians(runs: list[Probed]) -> str:
        def median(value: Callable[[Probed], float | None]) -> float:
            values = [v for r in runs if (v := value(r)) is not None]
            return statistics.median(values) if values else math.nan

        def probed(key: str) -> float:
            return median(lambda r: r.probe[key])

        def thread(name: str) -> float:
            return median(lambda r: r.probe["cpu_s"].get(name, 0.0))

        posts, server, reporter, sampler = probed("posts"), median(lambda r: r.server_cpu), *map(thread, THREADS)
        step, busy, quiet = probed("step_ms"), probed("busy_step_ms"), probed("quiet_step_ms")
        cpu, busy_cpu, quiet_cpu = probed("cpu_ms"), probed("busy_cpu_ms"), probed("quiet_cpu_ms")
        return (
            f"a run: {posts:.0f} posts, CPU of the reporter's thread {reporter:.3f} s, the sampler's {sampler:.3f} s, "
            f"the server's {server:.3f} s; a step {step:.3f} ms, during a post {busy:.3f} ms, otherwise {quiet:.3f} "
            f"ms; of the main thread's CPU {cpu:.3f} ms, {busy_cpu:.3f} ms, {quiet_cpu:.3f} ms"
        )


def python_path(*first: Path) -> str:
    """PYTHONPATH with these folders ahead of this repository."""
    return os.pathsep.join(filter(None, (*map(str, first), str(REPO), os.environ.get("PYTHONPATH"))))


def probed_run(
    tmp: Path,
    nproc: int,
    workload: str,
    epochs: int,
    server: LiveServer | None,
    arm_env: dict[str, str],
    *extra: str,
    watched: LiveServer,
) -> Probed:
    """One run through the probe, reporting to `server` (None: off); `watched` is the server whose CPU it counts."""
    env = outside_dashboard() | {"PYTHONPATH": python_path()} | arm_env
    if server is not None:
        token = secrets.token_hex(8)
        run_id = open_run(server, token)
        env |= {wire.ENV_RUN_ID: str(run_id), wire.ENV_SERVER_URL: server.url, wire.ENV_TOKEN: token,
                wire.ENV_RUN_DIR: str(tmp / f"run-{run_id}")}  # fmt: skip
    assert watched.process is not None
    process = psutil.Process(watched.process.pid)
    before = sum(process.cpu_times()[:2])
    # From the temporary folder: the trainer package is the one PYTHONPATH names first, not the working folder's.
    rate, output = train_once(tmp, nproc, workload, epochs, env, *extra, module="bench.trainer_probe", cwd=tmp)
    server_cpu = sum(process.cpu_times()[:2]) - before
    if server is not None:  # ended, as a launcher's run is when torchrun exits: else each round adds a live run
        set_run(server, run_id, status=RunStatus.succeeded, finished_at=utcnow())  # to every later tick's work
    probe = json.loads(next(line for line in output.splitlines() if line.startswith("[probe] "))[8:])
    return Probed(rate, probe, server_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--part", choices=("all", "workloads", "reporting"), default="all")
    parser.add_argument("--workload", default="mlp", help="the reporting part's workload")
    parser.add_argument("--precision", default="off", help="the reporting part's precision (bf16 on a GPU)")
    parser.add_argument("--ingest-nice", type=int, default=0, help="add an arm whose server's ingest is this nice")
    parser.add_argument("--ranks", type=int, nargs="*", help="the rank counts to run (default: 1 and 2, as GPUs allow)")
    parser.add_argument("--client-from", type=Path, help="add an arm whose trainer package is the one in this folder")
    parser.add_argument("--report-s", type=float, default=0.0, help="add an arm whose ranks post every this many s")
    parser.add_argument("--server-cpus", help="add an arm whose server keeps to these CPUs (RANKBOARD_SERVER_CPUS)")
    parser.add_argument("--apart-only", action="store_true", help="with --server-cpus, leave out the shared arm")
    args = parser.parse_args()
    if args.apart_only and not args.server_cpus:
        parser.error("--apart-only needs --server-cpus: it keeps only the arm whose server is on those CPUs")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `timeout` ends it as Ctrl-C would: with a summary
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder:  # a server may still be writing
        if args.part in ("all", "workloads"):
            workloads(Path(folder), args.repeats, args.epochs)
        if args.part in ("all", "reporting"):
            reporting(Path(folder), args.repeats, args.epochs, args.workload, args, "--precision", args.precision)


if __name__ == "__main__":
    main()
