"""Steps/s of each workload with 1 and 2 ranks, and what the dashboard's reporting costs a run.

.venv/bin/python -m bench.trainer_speed [--repeats 3] [--epochs 1]

Every figure is the trainer's own "N steps/s" line (the training loop alone, from its first step to its last; not
torchrun's start-up). Reporting: the same 2-rank mlp run with the client posting to a live server (loss, lr, grad
norm, samples/s every step, rank times, heartbeats, CPU samples) against the same run outside a dashboard
(the client a no-op), interleaved so that drift hits both alike.

Last measured (this 2-core machine, CPU, gloo; torch 2.13; medians of 3):
see the issue 3 note; re-run to refresh.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.live import LiveServer, open_run
from trainer import wire

RATE = re.compile(r"\[rank 0\] finished after \d+ steps, final loss [\d.na]+, ([\d.]+) steps/s")


def steps_per_s(tmp: Path, nproc: int, workload: str, epochs: int, env: dict[str, str], *extra: str) -> float:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "trainer", "--workload", workload, "--epochs", str(epochs), "--checkpoint-every", "1000",
        "--checkpoint-dir", str(tmp / secrets.token_hex(4)), *extra,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    match = RATE.search(done.stdout)
    if match is None:
        raise RuntimeError(f"no rate in the output:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return float(match.group(1))


def outside_dashboard() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith("RANKBOARD_")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        print("workload  ranks  steps/s (median)  samples/s")
        for workload, batch in (("mlp", 64), ("cnn", 64), ("charlm", 64)):
            for nproc in (1, 2):
                rates = [
                    steps_per_s(tmp, nproc, workload, args.epochs, outside_dashboard()) for _ in range(args.repeats)
                ]
                rate = statistics.median(rates)
                print(f"{workload:8}  {nproc:5}  {rate:16.1f}  {rate * batch * nproc:9.0f}", flush=True)

        server = LiveServer(tmp / "server")
        server.start()
        try:
            on, off = [], []
            for _ in range(args.repeats):
                token = secrets.token_hex(8)
                run_id = open_run(server, token)
                reporting = {**outside_dashboard(), wire.ENV_RUN_ID: str(run_id), wire.ENV_SERVER_URL: server.url,
                             wire.ENV_TOKEN: token, wire.ENV_RUN_DIR: str(tmp / f"run-{run_id}")}  # fmt: skip
                on.append(steps_per_s(tmp, 2, "mlp", args.epochs, reporting))
                off.append(steps_per_s(tmp, 2, "mlp", args.epochs, outside_dashboard()))
        finally:
            server.stop()
        print(f"mlp, 2 ranks, reporting on:  {statistics.median(on):.1f} steps/s  {sorted(on)}")
        print(f"mlp, 2 ranks, reporting off: {statistics.median(off):.1f} steps/s  {sorted(off)}")
        print(f"reporting costs {100 * (1 - statistics.median(on) / statistics.median(off)):+.1f}% of the step rate")


if __name__ == "__main__":
    main()
