"""Time from a run's failure (the transaction that makes it `failed` commits) to the webhook's call.

.venv/bin/python -m bench.alert_latency [--repeats 5]

Each run is a real torchrun of a script that exits 1; the receiver is an HTTP server on 127.0.0.1 in this process.
The failure's time is the run's `finished_at`, set in the supervisor's transaction just before it commits; the call's
time is when the receiver has read the POST. Both clocks are this machine's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.live import LiveServer, wait_for

received: dict[int, datetime] = {}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        received[body["run"]["id"]] = datetime.now().astimezone()
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    hooks = json.dumps([{"url": f"http://127.0.0.1:{receiver.server_address[1]}/", "events": ["failed"]}])
    latencies = []
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "shared").mkdir()
        (Path(root) / "shared" / "fails.py").write_text("raise SystemExit(1)\n")
        server = LiveServer(Path(root), RANKBOARD_ALERT_WEBHOOKS=hooks)
        server.start()
        try:
            with server.api() as api:
                for _ in range(args.repeats):
                    spec = {"name": "fails", "script": "fails.py", "nproc_per_node": 1}
                    run_id = api.post("/api/runs", json=spec).json()["id"]
                    wait_for(lambda: run_id in received, 120, what="the alert")  # noqa: B023
                    finished = datetime.fromisoformat(api.get(f"/api/runs/{run_id}").json()["finished_at"])
                    latencies.append((received[run_id] - finished).total_seconds())
        finally:
            server.stop()
            receiver.shutdown()
    print(f"run failed (committed) -> webhook called: median {statistics.median(latencies) * 1000:.0f} ms "
          f"(runs: {', '.join(f'{v * 1000:.0f}' for v in latencies)} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
