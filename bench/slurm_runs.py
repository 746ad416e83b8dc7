"""Slurm against local runs: POST -> running, POST -> first stored loss, stop -> stopped; and the server's cost of
watching many queued Slurm runs (one squeue per poll for all of them). Starts its own one-node cluster (root).

.venv/bin/python -m bench.slurm_runs [--repeats 2] [--queued 50] [--watch-s 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tests.live import LiveServer, points, wait_for
from tests.slurm import slurm_cluster

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def one_run(server: LiveServer, **options: object) -> dict[str, float]:
    """Seconds from the POST to running and to the first stored loss; from the stop request to `stopped`."""
    with server.api() as api:
        start = time.perf_counter()
        body = {"name": "bench", "epochs": 1000, **options}
        run_id = api.post("/api/runs", json=body).json()["id"]
        marks: dict[str, float] = {}

        def poll() -> bool:
            now = time.perf_counter() - start
            if api.get(f"/api/runs/{run_id}").json()["status"] == "running":
                marks.setdefault("running", now)
            if points(api, run_id, "loss", limit=1):
                marks.setdefault("first loss stored", now)
            return len(marks) == 2

        wait_for(poll, timeout=180, interval=0.05, what="the first loss")
        stop = time.perf_counter()
        api.post(f"/api/runs/{run_id}/stop")
        wait_for(lambda: api.get(f"/api/runs/{run_id}").json()["status"] == "stopped", 120, interval=0.05,
                 what="the stop")  # fmt: skip
        marks["stop -> stopped"] = time.perf_counter() - stop
    return marks


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def watch_cost(server: LiveServer, env: dict[str, str], *, queued: int, watch_s: float, root: Path) -> str:
    """The server's CPU while `queued` Slurm runs wait behind a job that holds the node."""
    blocker = root / "blocker.sh"
    blocker.write_text("#!/bin/bash\n#SBATCH --ntasks=2 --cpus-per-task=1\nsleep 3600\n")
    held = subprocess.run(["sbatch", "--parsable", f"--output={root}/blocker.out", str(blocker)], env=env,
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    try:
        with server.api() as api:
            ids = [api.post("/api/runs", json={"name": f"q{i}", "launcher": "slurm", "nproc_per_node": 1}).json()["id"]
                   for i in range(queued)]  # fmt: skip
            wait_for(lambda: all(api.get(f"/api/runs/{i}").json()["job_state"] == "PENDING" for i in ids), 120,
                     what="every run queued in Slurm")  # fmt: skip
            assert server.process is not None
            before, start = cpu_seconds(server.process.pid), time.perf_counter()
            time.sleep(watch_s)
            used, took = cpu_seconds(server.process.pid) - before, time.perf_counter() - start
            for run_id in ids:
                api.post(f"/api/runs/{run_id}/stop")
    finally:
        subprocess.run(["scancel", held], env=env)
    poll_s = float(server.env["RANKBOARD_SLURM_POLL_S"])
    return (f"{queued} queued Slurm runs watched for {took:.0f} s: server CPU {100 * used / took:.1f}% of a core "
            f"(squeue: 1 call per {poll_s:g} s for all of them = {60 / poll_s:.0f} calls/min)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--queued", type=int, default=50)
    parser.add_argument("--watch-s", type=float, default=30.0)
    args = parser.parse_args()
    with slurm_cluster() as env, tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        root.chmod(0o755)
        server = LiveServer(root / "server", SLURM_CONF=env["SLURM_CONF"], RANKBOARD_LAUNCHER="slurm",
                            RANKBOARD_SLURM_AGENTS_PER_NODE="2", RANKBOARD_SLURM_POLL_S="2",
                            RANKBOARD_STOP_GRACE_S="30", RANKBOARD_SLOTS="2")  # fmt: skip
        server.start()
        try:
            kinds = {
                "local, 2 ranks": {"nproc_per_node": 2},
                "Slurm, 2 agents x 1 rank": {"launcher": "slurm", "nproc_per_node": 1, "slurm_time_limit": "10:00"},
            }
            results = {
                kind: [one_run(server, **options) for _ in range(args.repeats)] for kind, options in kinds.items()
            }
            cost = watch_cost(server, env, queued=args.queued, watch_s=args.watch_s, root=root)
        finally:
            server.stop()
    for kind, runs in results.items():
        for mark in ("running", "first loss stored", "stop -> stopped"):
            values = [r[mark] for r in runs]
            print(f"{kind}: {mark}: median {statistics.median(values):.2f} s ({', '.join(f'{v:.2f}' for v in values)})")
    print(cost)


if __name__ == "__main__":
    main()
