"""Posts at the server for one node of 4 ranks, with its relay (rankboard.relay) and without (RANKBOARD_RELAY=off),
and what the relay's hop adds to a rank's batch: from the reporter's post to the server's answer back in the rank.

    .venv/bin/python -m bench.relay_posts [--seconds 10] [--rounds 3] [--ranks 4]

A real `rankboard serve` (tests/live.py, SQLite) and one run opened as the launcher leaves it; each rank is a
process of its own with the environment torchrun gives (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE) and reports through the
client's own Reporter.from_env, at 50 steps a second: rank 0 its loss and lr each step and every rank's step times
every 20 steps (as the built-in trainer does), every rank its heartbeat each step. Posts/s is the server's
`rankboard_ingest_batches` over the run's steady middle (from 2 s in to 1 s before the end); a batch's latency is
the time a rank's reporter spends in one post (to the relay and back, or to the server and back), median over ranks
1..N-1. Rounds alternate the two modes.

Measured on this 2-core machine (shared with other work), 2026-11-27, 4 ranks, 3 rounds of 12 s each: posts/s at the
server 2.55 (2.44-2.66) without the relay, 1.00 (0.99-1.11) with it; a rank's post 6.5 ms (6.1-7.7) median without,
10.0 ms (8.6-12.6) with: the hop adds ~3.5 ms at the median. Its p90 (140-220 ms) is the relay's window (a quarter
of the interval, at most 0.5 s), waited out when not every local rank posts in a tick: ranks other than 0 post every
other second here.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rankboard import relay, report, wire

from tests.live import LiveServer, open_run

TOKEN = "bench-token"
STEPS_PER_S = 50


def rank_process(environ: dict[str, str], seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """One rank: reports as the built-in trainer's ranks do for `seconds`, then sends back its post times (s)."""
    reporter = report.Reporter.from_env(environ)
    assert reporter is not None
    took: list[float] = []
    post = reporter._post  # timed where the reporter's thread calls it

    def timed(body: bytes, *, quiet: bool = False) -> report.Outcome:
        started = time.perf_counter()
        outcome = post(body, quiet=quiet)
        took.append(time.perf_counter() - started)
        return outcome

    reporter._post = timed  # type: ignore[method-assign]
    rank, ranks = int(environ["RANK"]), int(environ["LOCAL_WORLD_SIZE"])
    deadline, step = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        if rank == 0:
            reporter.log({"loss": 1 / (step + 1), "lr": 3e-4}, step=step)
            if step % wire.RANK_TIMES_EVERY == 0:
                for other in range(ranks):
                    reporter.log({"rank/step_ms": 20.0, "rank/data_ms": 2.0}, step=step, rank=other)
        reporter.heartbeat(step)
        step += 1
        time.sleep(1 / STEPS_PER_S)
    reporter.close()
    out.put((rank, took))


def batches_taken(server: LiveServer) -> float:
    scraped = text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
    return next(f.samples[0].value for f in scraped if f.name == "rankboard_ingest_batches")


def one_round(server: LiveServer, ranks: int, seconds: float, relayed: bool) -> tuple[float, list[float]]:
    """Posts per second at the server, and ranks 1.. post times (ms), for one run of `ranks` ranks."""
    run_id = open_run(server, TOKEN)
    spool = tempfile.mkdtemp(prefix="relay-bench-")
    base = {wire.ENV_RUN_ID: str(run_id), wire.ENV_SERVER_URL: server.url, wire.ENV_TOKEN: TOKEN,
            wire.ENV_RUN_DIR: spool, wire.ENV_LAUNCH_ID: f"bench-{run_id}", "LOCAL_WORLD_SIZE": str(ranks),
            relay.ENV_RELAY: "on" if relayed else "off"}  # fmt: skip
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    workers = [
        multiprocessing.Process(
            target=rank_process, args=({**base, "RANK": str(r), "LOCAL_RANK": str(r)}, seconds, out)
        )
        for r in range(ranks)
    ]
    for worker in workers:
        worker.start()
    # Steady state: from 2 s in (every rank started, the relay up) to 1 s before the ranks' closes, whose last
    # batches come at moments of their own.
    time.sleep(2)
    before, started = batches_taken(server), time.monotonic()
    time.sleep(seconds - 3)
    rate = (batches_taken(server) - before) / (time.monotonic() - started)
    times = dict(out.get(timeout=seconds + 60) for _ in workers)
    for worker in workers:
        worker.join()
    return rate, [1000 * t for rank, took in times.items() if rank > 0 for t in took]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    server = LiveServer(Path(tempfile.mkdtemp(prefix="relay-bench-")), RANKBOARD_PROMETHEUS="1",
                        RANKBOARD_SUPERVISE_INTERVAL_S="3600")  # fmt: skip
    server.start()
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    try:
        for _ in range(args.rounds):
            for relayed in (False, True):
                rate, took = one_round(server, args.ranks, args.seconds, relayed)
                results[relayed].append((rate, statistics.median(took)))
                mode, median = "on " if relayed else "off", statistics.median(took)
                p90 = statistics.quantiles(took, n=10)[-1]
                print(f"relay {mode}: {rate:.2f} posts/s, a rank's post {median:.1f} ms median (p90 {p90:.1f}, "
                      f"{len(took)} posts)", flush=True)  # fmt: skip
    finally:
        server.stop()
    for relayed, rows in results.items():
        rates, medians = [rate for rate, _ in rows], [median for _, median in rows]
        print(f"relay {'on ' if relayed else 'off'}: posts/s median {statistics.median(rates):.2f} "
              f"({min(rates):.2f}-{max(rates):.2f}); a rank's post median {statistics.median(medians):.1f} ms "
              f"({min(medians):.1f}-{max(medians):.1f})")  # fmt: skip


if __name__ == "__main__":
    main()
