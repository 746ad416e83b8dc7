"""GPU and system samples in the store, before and after their codec: bytes a point, ingest cost, a loss beside them.

    .venv/bin/python -m bench.samples_codec --before /tmp/rb-before [--minutes 60] [--gpus 8] [--rounds 3]

`--before` is a checkout of the code to compare with (`git archive <commit> | tar -x -C /tmp/rb-before`), `--after`
the code measured (default: this tree). One node's samples as rankboard.gpu sends them, one point per field per
second at step = unix seconds, each sample's time the sink's time.time(): a GPU node (`gpu/<host>/<i>/<field>`, the
8 fields of each of `--gpus` GPUs) and a node without NVML (`sys/<host>/<field>`), and for comparison a training
`loss` (a noisy float every 30-50 ms). The samples' values, as an H100 under a training load gives them (NVML notes
in shared/NVML-H100.md): utilisation a whole percent, mostly 100 with dips; memory used in bytes, changing now and
then by 2 MiB; temperature whole degrees drifting; power NVML's milliwatts as watts, a few watts of noise around
690; the limit, clock, total memory and the run's memory mostly constant; the host's CPU percent with psutil's one
decimal and its used memory in bytes changing every second. The times: each a second after the last plus the
sampler's own overhead, that overhead measured here by the sampler's loop (Event.wait and a psutil read) run at 20
ms, so its jitter is this machine's.

Each code (PYTHONPATH picks the tree) stores the same stream through its store (insert_points and refresh_tiers, a
transaction per 2-second batch of every series, as a trainer's client flushes them, and the loss in 1,000-point
batches), `--rounds` times taking turns; reported: the bytes a point of each table (SQLite's dbstat; the chunks are
the points, the tiers the charts' index), the median CPU time of a batch per point, and after / before. The after
store is read back and compared bit for bit with what was sent.

Last measured (issue 43; this 2-core machine, shared, load 5; 10 minutes, 8 GPUs, 5 rounds a side; before = 186ffcb,
after = it with the samples' codec): bytes a point of the blobs (and with their rows' share of the table), GPU
samples 4.86 (6.50) before, 2.94 (4.27) after; a host's 6.02 (7.66) and 3.86 (5.19); the loss 11.22 both, byte for
byte. Of a GPU sample's 2.9 bytes (each column deflated alone), the time takes about 1.9 (this machine's sampler
jitter: a second plus 0.3 ms, 1.6-4 ms at the 90th percentile, each time exact to its float's last bit), the value
0.5, the step 0.1, the chunk's head 0.3. Ingest CPU a
point, samples 46.8 us before (42.5-52.8 over rounds), 48.4 after (41.7-52.9): within the rounds' spread; the loss
1.56 and 1.58. Everything read back bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parents[1]
START = 1_763_000_000
BATCH_S = 2  # seconds of samples a batch
LOSS_BATCH = 1000


def sampler_overheads(count: int) -> np.ndarray:
    """How much later than a second after the last each of `count` samples comes: Event.wait's lateness and a
    psutil read, as the sampler's loop pays them (run at 20 ms, so as not to take minutes)."""
    import psutil

    stop, overheads = threading.Event(), []
    psutil.cpu_percent(interval=None)
    for _ in range(count):
        started = time.time()
        stop.wait(0.02)
        psutil.cpu_percent(interval=None)
        overheads.append(time.time() - started - 0.02)
    return np.array(overheads)


def walk(rng: np.random.Generator, n: int, start: float, step: float, low: float, high: float, p: float) -> np.ndarray:
    """A value that moves by +-`step` with probability `p` each second, kept within [low, high]."""
    moves = rng.choice([-step, step], n) * (rng.random(n) < p)
    return np.clip(start + np.cumsum(moves), low, high)


def gpu_fields(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """One H100's fields for n seconds of training, in rankboard.gpu's units."""
    util = np.where(rng.random(n) < 0.05, rng.integers(0, 100, n), 100).astype(float)
    mem_used = walk(rng, n, 79_000 * 2**20, 2 * 2**20, 70_000 * 2**20, 81_000 * 2**20, 0.01)
    power = rng.normal(690_000, 4_000, n).round().astype(np.int64) / 1000  # NVML's mW as W
    clock = np.where(rng.random(n) < 0.05, 1755.0, 1980.0)
    return {"util": util, "mem_used": mem_used, "mem_total": np.full(n, 85_520_809_984.0),
            "temp": walk(rng, n, 62, 1, 40, 80, 0.1), "power": power, "power_limit": np.full(n, 700.0),
            "sm_clock": clock, "run_mem": np.full(n, 77_310_000_000.0)}  # fmt: skip


def sys_fields(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """A host's CPU percent (psutil's one decimal) and memory used and total, in bytes."""
    cpu = np.round(np.clip(rng.normal(60, 15, n), 0, 100), 1)
    used = (40 * 2**30 + np.cumsum(rng.integers(-2000, 2000, n)) * 4096).astype(float)
    return {"cpu_percent": cpu, "mem_used": used, "mem_total": np.full(n, 540_000_000_000.0)}


def stream(args: argparse.Namespace, folder: Path) -> Path:
    """Every series' points, written to an .npz: key -> steps, values, times."""
    rng = np.random.default_rng(0)
    n = args.minutes * 60
    overheads = rng.choice(sampler_overheads(600), n)
    times = START + 0.2 + np.arange(n) + np.cumsum(overheads)  # a sample's time: its loop's clock
    steps = times.astype(np.int64)  # the sampler's step: int(time.time()) a moment before
    arrays: dict[str, np.ndarray] = {}
    fields = {f"gpu/node-a/{index}/{field}": values for index in range(args.gpus)
              for field, values in gpu_fields(rng, n).items()}  # fmt: skip
    fields |= {f"sys/node-b/{field}": values for field, values in sys_fields(rng, n).items()}
    for key, values in fields.items():
        arrays |= {f"{key}/s": steps, f"{key}/v": values.astype(float), f"{key}/t": times}
    losses = n * 25  # a step every 40 ms on average
    loss_steps = np.arange(losses)
    loss = 2.0 / np.sqrt(loss_steps + 1) + rng.normal(0, 0.01, losses)
    arrays |= {"loss/s": loss_steps, "loss/v": loss, "loss/t": START + np.cumsum(rng.uniform(0.03, 0.05, losses))}
    path = folder / "stream.npz"
    np.savez(path, **arrays)
    return path


def keys_of(data: Any) -> list[str]:
    return sorted({name.rsplit("/", 1)[0] for name in data.files})


def store(url: str, data_path: str) -> None:
    """Runs in the tree measured: stores the stream, prints bytes per table, CPU per batch, and a read-back check."""
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from app.core.db import make_engine, upgrade
    from app.core.models import Run, RunStatus
    from app.store import charts as chart_store
    from app.store import chunks
    from app.store import metrics as metric_store

    upgrade(url)
    data = np.load(data_path)
    keys = keys_of(data)
    engine = make_engine(url)
    with Session(engine) as db, db.begin():
        run = Run(name="bench", status=RunStatus.succeeded, workload="mlp", nproc_per_node=1)
        db.add(run)
        db.flush()
        ids = metric_store.series_ids(db, run_id=run.id, keys=keys)
    cpu: dict[str, list[float]] = {"samples": [], "loss": []}

    def send(columns: dict[tuple[int, int], Any], kind: str, points: int) -> None:
        started = time.process_time()
        with Session(engine) as db, db.begin():
            chart_store.refresh_tiers(db, metric_store.insert_points(db, columns))
        cpu[kind].append((time.process_time() - started) / points * 1e6)

    samples = [key for key in keys if key != "loss"]
    n = len(data[f"{samples[0]}/s"])
    for first in range(0, n, BATCH_S):
        part = slice(first, first + BATCH_S)
        columns = {(ids[key], 0): chunks.Column(data[f"{key}/s"][part], data[f"{key}/v"][part], data[f"{key}/t"][part])
                   for key in samples}  # fmt: skip
        send(columns, "samples", sum(len(column.steps) for column in columns.values()))
    loss = [data[f"loss/{part}"] for part in "svt"]
    for first in range(0, len(loss[0]), LOSS_BATCH):
        part = slice(first, first + LOSS_BATCH)
        send({(ids["loss"], 0): chunks.Column(*(column[part] for column in loss))}, "loss", len(loss[0][part]))
    with Session(engine) as db:
        exact = all(same(chunks.read(db, series_id=ids[key], first=0, last=2**62), data, key) for key in keys)
        rows = db.execute(text("SELECT s.key, SUM(c.n), SUM(LENGTH(c.data)), COUNT(*) FROM metric_chunks c"
                               " JOIN metric_series s ON s.id = c.series_id GROUP BY s.key")).all()  # fmt: skip
        tables = dict(db.execute(text("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")).all())
    engine.dispose()
    blobs = {key: (int(points), int(size), int(chunks_)) for key, points, size, chunks_ in rows}
    print(json.dumps({"cpu_us": {kind: statistics.median(times) for kind, times in cpu.items()}, "exact": exact,
                      "blobs": blobs, "tables": tables}))  # fmt: skip


def same(points: Any, data: Any, key: str) -> bool:
    """Whether the series reads back as sent, bit for bit."""
    sent = [data[f"{key}/{part}"] for part in "svt"]
    return (np.array_equal(points.steps, sent[0]) and points.values.tobytes() == sent[1].astype(float).tobytes()
            and points.times.tobytes() == sent[2].tobytes())  # fmt: skip


def measure(tree: Path, data: Path, folder: Path, number: int) -> dict[str, Any]:
    db = folder / f"{tree.name}-{number}.db"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, __file__, "store", f"sqlite:///{db}", str(data)], env=env, check=True,
                          capture_output=True, text=True)  # fmt: skip
    db.unlink()
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def report(results: dict[str, list[dict[str, Any]]], data_path: Path) -> None:
    data = np.load(data_path)
    kinds = {"GPU samples (gpu/*)": "gpu/", "system samples (sys/*)": "sys/", "loss": "loss"}
    for name, results_of in results.items():
        last = results_of[-1]
        print(f"{name}: read back bit for bit: {last['exact']}")
        every = last["blobs"].values()
        # What a chunk's row costs beside its blob (key, n, first_time, SQLite's header, the B-tree's share).
        per_row = (last["tables"]["metric_chunks"] - sum(s for _, s, _ in every)) / sum(c for _, _, c in every)
        for kind, prefix in kinds.items():
            chosen = [value for key, value in last["blobs"].items() if key.startswith(prefix)]
            points, size, rows = (sum(value[i] for value in chosen) for i in range(3))
            print(f"  {kind:24} {points:>9,} points, blobs {size / points:5.2f} bytes a point, with their rows "
                  f"{(size + rows * per_row) / points:5.2f}")  # fmt: skip
        points = sum(p for p, _, _ in every)
        for table in ("metric_chunks", "metric_tiers"):
            print(f"  table {table:18} {last['tables'].get(table, 0) / points:5.2f} bytes a point (all series)")
        for kind in ("samples", "loss"):
            cpu = [result["cpu_us"][kind] for result in results_of]
            print(f"  ingest CPU, {kind:8} median {statistics.median(cpu):.2f} us a point "
                  f"({min(cpu):.2f}-{max(cpu):.2f} over rounds)")  # fmt: skip
    del data


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "store":
        store(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the code to compare with")
    parser.add_argument("--after", type=Path, default=HERE, help="the code to measure (default: this tree)")
    parser.add_argument("--minutes", type=int, default=60, help="minutes of samples")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="builds of each store, taking turns")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        data = stream(args, folder)
        results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for number in range(args.rounds):
            for name in ("before", "after") if number % 2 == 0 else ("after", "before"):
                results[name].append(measure(getattr(args, name).resolve(), data, folder, number))
        print(f"{args.minutes} minutes of one node's samples ({args.gpus} GPUs), a host's, and a loss; "
              f"{args.rounds} rounds a side:")  # fmt: skip
        report(results, data)
        ratio = statistics.median(r["cpu_us"]["samples"] for r in results["after"]) / statistics.median(
            r["cpu_us"]["samples"] for r in results["before"]
        )
        print(f"ingest CPU of samples, after / before: {ratio:.3f}")


if __name__ == "__main__":
    main()
