"""Import speed of `rankboard import tensorboard` against TensorBoard's own reading of the same log, in points/s.

    .venv/bin/python -m bench.import_tensorboard [--points 1000000] [--repeats 3]

The log is what PyTorch's SummaryWriter writes: 4 scalar series of --points/4 steps each, in one event file. Timed,
interleaved in each repeat:
- tensorboard's EventAccumulator (the reader of `tensorboard --logdir` without its Rust data server), every scalar
  kept (size_guidance 0);
- rankboard's reading alone (rankboard.importers.tensorboard: TFRecord framing here, TensorBoard's Event protos);
- the whole import: reading, posting every point to a live server (SQLite) and its storing them, each repeat into a
  fresh server.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rankboard.client import Client
from rankboard.importers import Reading, SourceRun, tensorboard
from rankboard.importers.upload import Uploader
from tensorboard.backend.event_processing import event_accumulator
from torch.utils.tensorboard import SummaryWriter

from tests.live import serving

KEYS = ("loss", "lr", "acc", "grad_norm")


def write_log(folder: Path, points: int) -> None:
    writer = SummaryWriter(str(folder), max_queue=10_000, flush_secs=600)
    for step in range(points // len(KEYS)):
        for key in KEYS:
            writer.add_scalar(key, 1.0 / (step + 1), step)
    writer.close()


def tensorboard_reading(folder: Path) -> tuple[float, int]:
    start = time.perf_counter()
    accumulator = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    count = sum(len(accumulator.Scalars(tag)) for tag in accumulator.Tags()["scalars"])
    return time.perf_counter() - start, count


def our_reading(folder: Path) -> tuple[float, int]:
    start = time.perf_counter()
    [run] = tensorboard.runs(folder)
    assert isinstance(run, SourceRun)
    count = sum(1 for _ in run.read(Reading()))
    return time.perf_counter() - start, count


def whole_import(folder: Path, scratch: Path) -> tuple[float, int]:
    with serving(scratch) as server:
        start = time.perf_counter()
        [run] = tensorboard.runs(folder)
        assert isinstance(run, SourceRun)
        imported = Uploader(Client(server.url)).upload(run, Reading())
        return time.perf_counter() - start, imported.stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "log"
        write_log(log, args.points)
        rates: dict[str, list[float]] = {"tensorboard EventAccumulator": [], "rankboard reading": [],
                                         "rankboard import (read + post + store)": []}  # fmt: skip
        for repeat in range(args.repeats):
            for name, (seconds, count) in zip(rates, (tensorboard_reading(log), our_reading(log),
                                                      whole_import(log, Path(scratch) / f"server{repeat}")),
                                              strict=True):  # fmt: skip
                assert count == args.points, (name, count)
                rates[name].append(count / seconds)
        print(f"{args.points:,} points, {args.repeats} repeats; points/s, median (min..max)")
        for name, values in rates.items():
            print(f"  {name:<40} {statistics.median(values):>12,.0f}  ({min(values):,.0f}..{max(values):,.0f})")
        baseline = statistics.median(rates["tensorboard EventAccumulator"])
        for name in list(rates)[1:]:
            print(f"  {name} / tensorboard's reading: {statistics.median(rates[name]) / baseline:.1f}x")


if __name__ == "__main__":
    main()
