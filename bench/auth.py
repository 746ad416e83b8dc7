"""The cost of authentication per request: kept-alive GETs with no authentication (no user), with a session cookie,
and with a bearer token; optionally against another checkout (the code before authentication) as a baseline.

    .venv/bin/python -m bench.auth [--requests 2000] [--rounds 3] [--baseline /work/main]

Real `rankboard serve` processes (tests/live.py) on 127.0.0.1, one per mode, all idle but the one measured. Each
mode sends GET /api/runs?limit=1 (one run stored) on one kept-alive connection (http.client), after 100 to warm up;
rounds alternate the modes so drift on this shared machine hits all alike. Printed per mode: the median and p90 of
each round's latencies, the median over rounds, and its ratio to "auth off".

This machine has 2 cores shared with other work: compare figures only within one run of the benchmark.

Last measured (branch `auth`, baseline main at 0be327f; 2,000 GETs x 3 rounds; machine load 2-3.5, two runs): auth
off 1.42 / 1.94 ms against main's 1.43 / 2.40 ms (the Host and Origin checks cost nothing measurable); a session
cookie 2.32 / 2.85 ms (x1.63 / x1.47), a bearer token 2.37 / 2.99 ms (x1.66 / x1.54): about 0.5-1 ms per request,
one hop to a worker thread and one indexed read of the session or token (its last use is written once a minute).
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from app.services.users import csrf_token
from tests import live
from tests.live import LiveServer

PASSWORD = "bench-admin-password"
PATH = "/api/runs?limit=1"


class CheckoutServer(LiveServer):
    """A LiveServer run from another checkout (its own `app`), for the baseline."""

    def __init__(self, root: Path, repo: Path) -> None:
        super().__init__(root)
        self.repo = repo

    def start(self) -> None:
        original = live.REPO
        live.REPO = self.repo
        try:
            super().start()
        finally:
            live.REPO = original


def latencies(port: int, headers: dict[str, str], count: int) -> list[float]:
    """Seconds of each of `count` GETs on one kept-alive connection, after 100 to warm up."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    found = []
    for i in range(100 + count):
        start = time.perf_counter()
        connection.request("GET", PATH, headers=headers)
        response = connection.getresponse()
        response.read()
        if i >= 100:
            found.append(time.perf_counter() - start)
        assert response.status == 200, response.status
    connection.close()
    return found


def credentials(server: LiveServer) -> tuple[dict[str, str], dict[str, str]]:
    """A session cookie's headers and a bearer token's, for an admin of `server`."""
    with httpx.Client(base_url=server.url) as browser:
        login = browser.post("/login", data={"name": "admin", "password": PASSWORD})
        assert login.status_code == 303, login.text
        session_id = browser.cookies["rankboard_session"]
        made = browser.post("/api/tokens", json={"name": "bench", "role": "admin", "expires": "1d"},
                            headers={"X-CSRF-Token": csrf_token(session_id)})  # fmt: skip
        assert made.status_code == 201, made.text
        browser.post("/api/runs", json={"name": "one run"}, headers={"X-CSRF-Token": csrf_token(session_id)})
    return {"Cookie": f"rankboard_session={session_id}"}, {"Authorization": f"Bearer {made.json()['token']}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout to measure the same GET against")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        servers = {"auth off": LiveServer(root / "off", RANKBOARD_SUPERVISE_INTERVAL_S="3600"),
                   "with auth": LiveServer(root / "on", RANKBOARD_ADMIN_PASSWORD=PASSWORD,
                                           RANKBOARD_SUPERVISE_INTERVAL_S="3600")}  # fmt: skip
        if args.baseline:
            servers["before"] = CheckoutServer(root / "before", args.baseline.resolve())
        for server in servers.values():
            server.start()
        try:
            cookie, bearer = credentials(servers["with auth"])
            for name, server in servers.items():
                if name != "with auth":
                    httpx.post(f"{server.url}/api/runs", json={"name": "one run"}).raise_for_status()
            modes = {"auth off": (servers["auth off"], {}), "session cookie": (servers["with auth"], cookie),
                     "bearer token": (servers["with auth"], bearer)}  # fmt: skip
            if args.baseline:
                modes = {"before (baseline)": (servers["before"], {}), **modes}
            medians: dict[str, list[float]] = {mode: [] for mode in modes}
            for round_number in range(args.rounds):
                for mode, (server, headers) in modes.items():
                    found = sorted(latencies(server.port, headers, args.requests))
                    medians[mode].append(statistics.median(found))
                    p90 = found[int(0.9 * len(found))]
                    print(f"round {round_number + 1} {mode:18} median {1e3 * medians[mode][-1]:.3f} ms, "
                          f"p90 {1e3 * p90:.3f} ms", flush=True)  # fmt: skip
            off = statistics.median(medians["auth off"])
            for mode, values in medians.items():
                middle = statistics.median(values)
                print(f"{mode:18} median of rounds {1e3 * middle:.3f} ms  x{middle / off:.2f} of auth off")
        finally:
            for server in servers.values():
                server.stop()


if __name__ == "__main__":
    main()
