"""Offline first: what writing a run to its folder costs the reporter's thread, and how fast `rankboard sync` uploads
it, in points/s.

    .venv/bin/python -m bench.offline_sync [--points 1000000] [--repeats 3]

Each repeat: one offline process's folder of --points points (4 series, logged as a training loop logs them), made
by the reporter itself (`Reporter(offline=True)`, its final flush timed: encoding every batch and appending it to
the spool, the thread's work); then `rankboard sync` into a fresh live server (SQLite) as a user runs it, timed
whole (process start, join, every batch posted and stored, the ending); then the same sync again, which finds the
run ended and sends nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rankboard import external
from rankboard.offline import RankFiles
from rankboard.report import Reporter

from tests.live import REPO, serving

KEYS = ("loss", "lr", "acc", "grad_norm")


def write_folder(folder: Path, points: int, key: str) -> float:
    """The folder of one offline process; returns the seconds its reporter took to write it."""
    join = external.join_request({}, key=key, name="bench", config={"lr": 0.1}, takes_stop=False)
    RankFiles.of(folder, join.host, join.rank).write_join(join)
    reporter = Reporter("", None, "", folder, start=False, join=join, offline=True)
    for step in range(points // len(KEYS)):
        reporter.log({name: 1.0 / (step + 1) for name in KEYS}, step=step)
    reporter.ended("finished")
    start = time.perf_counter()
    reporter.close(timeout=600)
    return time.perf_counter() - start


def sync(url: str, folder: Path) -> tuple[float, dict]:
    start = time.perf_counter()
    command = [sys.executable, "-m", "app.cli", "sync", str(folder), "--url", url, "--json"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800, check=True)
    return time.perf_counter() - start, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    written, synced, again = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            folder = Path(scratch) / f"run{repeat}"
            written.append(args.points / write_folder(folder, args.points, f"bench-{repeat}"))
            with serving(Path(scratch) / f"server{repeat}") as server:
                seconds, said = sync(server.url, folder)
                assert said["stored"] == args.points and said["status"] == "succeeded", said
                synced.append(args.points / seconds)
                seconds, said = sync(server.url, folder)
                assert said["already"], said
                again.append(seconds)
    print(f"{args.points:,} points, {args.repeats} repeats; median (min..max)")
    print(f"  written offline (reporter's thread)  {statistics.median(written):>12,.0f} points/s  "
          f"({min(written):,.0f}..{max(written):,.0f})")  # fmt: skip
    print(f"  rankboard sync (post + store)        {statistics.median(synced):>12,.0f} points/s  "
          f"({min(synced):,.0f}..{max(synced):,.0f})")  # fmt: skip
    print(f"  rankboard sync again (nothing sent)  {statistics.median(again):>12.2f} s  "
          f"({min(again):.2f}..{max(again):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
