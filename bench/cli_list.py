"""What `rankboard runs list` costs against curl for the same listing, start-up included.

    .venv/bin/python bench/cli_list.py [--repeats 20] [--runs 50]

Starts a real server (its supervisor asleep, so the runs made stay queued and nothing trains), makes `--runs` runs,
then times, alternately, each command as a user types it, as a fresh process: `curl` of /api/runs, `rankboard runs
list` and `--json`, the CLI's imports alone, and a bare `python -c pass` for the interpreter's own start-up. Prints
each one's median and spread in milliseconds.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.live import REPO, LiveServer

RANKBOARD = str(REPO / ".venv" / "bin" / "rankboard")


def wall_ms(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    curl = shutil.which("curl")
    if curl is None:
        sys.exit("curl is not installed")
    with tempfile.TemporaryDirectory() as folder:
        server = LiveServer(Path(folder), RANKBOARD_SUPERVISE_INTERVAL_S="3600")
        server.start()
        try:
            with server.api() as api:
                for i in range(args.runs):
                    api.post("/api/runs", json={"name": f"bench-{i}", "nproc_per_node": 1}).raise_for_status()
            commands = {
                "curl /api/runs?limit=50": [curl, "-sf", f"{server.url}/api/runs?limit=50"],
                "rankboard runs list": [RANKBOARD, "runs", "list", "--url", server.url],
                "rankboard runs list --json": [RANKBOARD, "runs", "list", "--json", "--url", server.url],
                "python: import the CLI, no request": [sys.executable, "-c", "import rankboard.cli"],
                "python -c pass (start-up alone)": [sys.executable, "-c", "pass"],
            }
            times: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(args.repeats):
                for name, command in commands.items():
                    times[name].append(wall_ms(command))
        finally:
            server.stop()
    print(f"{args.runs} runs listed, {args.repeats} times each, alternating")
    for name, found in times.items():
        quartiles = statistics.quantiles(found, n=4)
        print(f"{name:<34} median {statistics.median(found):7.1f} ms   (quartiles {quartiles[0]:.1f} to "
              f"{quartiles[2]:.1f})")  # fmt: skip


if __name__ == "__main__":
    main()
