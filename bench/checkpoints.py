"""Checkpoint listing and download speed.

    .venv/bin/python -m bench.checkpoints [--files 10000] [--download-mb 1024] [--repeats 5]

1. GET /api/runs/{id}/checkpoints and GET /api/files on a folder of N checkpoints, each with its metadata file.
2. Download of a large file through GET /api/files/download (by curl, to /dev/null) against `cp` of
   the same file on the same disk, with the page cache dropped where possible (it is not, without root: then both
   read from the cache, which is the fair comparison of the server's own overhead).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tests.live import LiveServer


def make_checkpoints(folder: Path, count: int) -> None:
    folder.mkdir(parents=True)
    for step in range(1, count + 1):
        name = f"step-{step:08d}"
        (folder / f"{name}.pt").write_bytes(b"\0" * 1024)
        meta = {"file": f"{name}.pt", "step": step, "epoch": step, "reason": "epoch", "size": 1024,
                "metrics": {"loss": 1 / step, "epoch_loss": 2 / step}, "written_at": time.time()}  # fmt: skip
        (folder / f"{name}.json").write_text(json.dumps(meta))


def timed(call, repeats: int) -> list[float]:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def download(url: str, path: str) -> None:
    # curl, as a person downloads: a Python client would measure its own loop as much as the server.
    subprocess.run(["curl", "-sf", "-o", "/dev/null", f"{url}/api/files/download?path={path}"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--download-mb", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as root:
        server = LiveServer(Path(root), RANKBOARD_SUPERVISE_INTERVAL_S="3600")
        server.start()
        try:
            with server.api() as api:
                run_id = api.post("/api/runs", json={"name": "bench"}).json()["id"]
                make_checkpoints(Path(root) / "shared" / "checkpoints" / f"run-{run_id}", args.files)
                listed = timed(lambda: api.get(f"/api/runs/{run_id}/checkpoints").raise_for_status(), args.repeats)
                browsed = timed(lambda: api.get("/api/files", params={"path": f"checkpoints/run-{run_id}"}),
                                args.repeats)  # fmt: skip
            big = Path(root) / "shared" / "datasets" / "big.bin"
            big.parent.mkdir()
            with open(big, "wb") as f:
                for _ in range(args.download_mb):
                    f.write(os.urandom(1 << 20))
            served = timed(lambda: download(server.url, "datasets/big.bin"), 3)
            copied = timed(lambda: subprocess.run(["cp", str(big), str(Path(root) / "copy.bin")], check=True), 3)
        finally:
            server.stop()
    print(
        f"list {args.files:,} checkpoints (API, from metadata files): median {statistics.median(listed) * 1000:.0f} ms"
    )
    browse_ms = statistics.median(browsed) * 1000
    print(f"browse the same folder ({2 * args.files:,} files, /api/files): median {browse_ms:.0f} ms")
    mb = args.download_mb
    http_rate, cp_rate = mb / statistics.median(served), mb / statistics.median(copied)
    print(
        f"download {mb} MiB over HTTP: median {http_rate:,.0f} MiB/s; cp on the same disk: {cp_rate:,.0f} MiB/s; "
        f"ratio {http_rate / cp_rate:.2f}"
    )


if __name__ == "__main__":
    main()
