"""Time from `POST /api/runs` to the first stored metric point of a 2-rank run, and the phases in between.

.venv/bin/python -m bench.first_point [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tests.live import LiveServer, points, wait_for


def one_run(server: LiveServer) -> dict[str, float]:
    """Seconds from the POST to: torchrun started, the first point stored, the first progress (running)."""
    with server.api() as api:
        start = time.perf_counter()
        run_id = api.post("/api/runs", json={"name": "first-point", "epochs": 1, "nproc_per_node": 2}).json()["id"]
        marks: dict[str, float] = {}

        def poll() -> bool:
            now = time.perf_counter() - start
            run = api.get(f"/api/runs/{run_id}").json()
            if run["status"] != "queued":
                marks.setdefault("torchrun started", now)
            if points(api, run_id, "loss", limit=1):
                marks.setdefault("first point stored", now)
            return "first point stored" in marks

        wait_for(poll, timeout=120, interval=0.02, what="the first point")
        api.post(f"/api/runs/{run_id}/stop")
        wait_for(lambda: api.get(f"/api/runs/{run_id}").json()["status"] == "stopped", 60, what="the stop")
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        server = LiveServer(Path(root))
        server.start()
        try:
            results = [one_run(server) for _ in range(args.repeats)]
        finally:
            server.stop()
    for mark in ("torchrun started", "first point stored"):
        values = [r[mark] for r in results]
        print(
            f"POST /api/runs -> {mark}: median {statistics.median(values):.2f} s "
            f"(runs: {', '.join(f'{v:.2f}' for v in values)})"
        )


if __name__ == "__main__":
    main()
