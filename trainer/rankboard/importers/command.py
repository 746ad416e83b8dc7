"""`rankboard import tensorboard DIR`, `rankboard import mlflow URI`, `rankboard import wandb DIR`: a progress bar on
stderr while it posts, then what was imported and what was skipped, and why, on stdout."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, TextIO

from ..client import ClientError
from . import Reading, SourceRun, Unreadable, fitting_tags
from .upload import Imported, Uploader

SOURCES = {
    "tensorboard": ("DIR", "a folder of TensorBoard event files; each folder that holds some is a run", "tensorboard"),
    "mlflow": ("URI", "an MLflow tracking URI (sqlite:///mlflow.db, an mlruns folder, http://...) or a .db file",
               "mlflow"),
    "wandb": ("DIR", "a W&B run folder, a wandb/ folder of offline or synced runs, or a folder above them", "wandb"),
}  # fmt: skip
EXIT_SOME_FAILED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The source, where it is, and what to add to each run."""
    parser.add_argument("source", choices=list(SOURCES), help="the tracker the runs come from")
    parser.add_argument("where", help="; ".join(f"{name}: {what[1]}" for name, what in SOURCES.items()))
    parser.add_argument("--tag", action="append", default=[], help="a tag for every run imported; repeat it")
    parser.add_argument("--experiment", help="mlflow: only this experiment's runs (by its name)")


def import_runs(uploader: Uploader, args: argparse.Namespace) -> int:
    """Import every run of the source; a run that cannot be read is said and skipped, the others go on."""
    summary = Summary()
    bar = Bar(sys.stderr)
    for run in _source_runs(args):
        if isinstance(run, Unreadable):
            summary.failed.append(f"{run.name}: {run.error}")
            continue
        run = dataclasses.replace(run, tags=fitting_tags([*run.tags, *args.tag], Counter()))
        reading = Reading()
        bar.start(run)
        try:
            imported = uploader.upload(run, reading, lambda: bar.show(reading))  # noqa: B023 - called within this turn
        except ClientError:
            raise  # the server refused or went away: the next runs would fare no better
        except Exception as error:  # a damaged file of one run: said, and the other runs imported
            summary.failed.append(f"{run.name}: {type(error).__name__}: {error}")
            bar.end(f"could not be read: {error}")
            continue
        summary.add(run, imported, reading)
        bar.end("already imported" if imported.already else f"{imported.points:,} points")
    print(json.dumps(summary.to_json()) if args.json else summary.text())
    return EXIT_SOME_FAILED if summary.failed else 0


def _source_runs(args: argparse.Namespace) -> Iterator[SourceRun | Unreadable]:
    try:
        module: Any = importlib.import_module(f"rankboard.importers.{args.source}")
    except ImportError as error:
        package = SOURCES[args.source][2]
        raise ClientError(f"importing from {args.source} needs the {package} package ({error.name} is missing): "
                          "pip install 'rankboard[import]'") from None  # fmt: skip
    if args.source == "mlflow":
        return module.runs(args.where, experiment=args.experiment)
    return module.runs(args.where)


@dataclasses.dataclass
class Summary:
    """What an import did, to print at its end."""

    runs: list[tuple[SourceRun, Imported]] = dataclasses.field(default_factory=list)
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)
    failed: list[str] = dataclasses.field(default_factory=list)

    def add(self, run: SourceRun, imported: Imported, reading: Reading) -> None:
        self.runs.append((run, imported))
        self.skipped.update(reading.skipped)

    def text(self) -> str:
        new = [imported for _, imported in self.runs if not imported.already]
        points, stored = sum(i.points for i in new), sum(i.stored for i in new)
        lines = [f"imported {len(new)} runs ({points:,} points, {stored:,} of them new); "
                 f"{len(self.runs) - len(new)} imported before, left as they are"]  # fmt: skip
        for run, imported in self.runs:
            what = "imported before" if imported.already else f"{imported.points:,} points"
            lines.append(f"  run {imported.run_id:>6}  {run.name}  ({what})")
        if self.skipped:
            lines.append("skipped:")
            lines += [f"  {count:>8,}  {reason}" for reason, count in self.skipped.most_common()]
        lines += [f"not imported: {failure}" for failure in self.failed]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        runs = [{"run_id": i.run_id, "name": r.name, "key": r.key, "points": i.points, "stored": i.stored,
                 "already": i.already} for r, i in self.runs]  # fmt: skip
        return {"runs": runs, "skipped": dict(self.skipped), "failed": self.failed}


class Bar:
    """One run's progress on a terminal, redrawn in place at most 10 times a second; elsewhere (a log, a pipe), one
    line per run once it is done."""

    WIDTH = 30

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.run: SourceRun | None = None
        self.drawn_at = 0.0
        self.count = 0

    def start(self, run: SourceRun) -> None:
        self.run, self.count = run, self.count + 1

    def show(self, reading: Reading) -> None:
        now = time.monotonic()
        if not self.live or self.run is None or now - self.drawn_at < 0.1:
            return
        self.drawn_at = now
        share = min(reading.done / self.run.total, 1.0) if self.run.total else 0.0
        filled = int(share * self.WIDTH)
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {share:4.0%}  run {self.count}: "
                          f"{self.run.name[:40]}")  # fmt: skip
        self.stream.flush()

    def end(self, outcome: str) -> None:
        line = f"run {self.count}: {self.run.name if self.run else ''}: {outcome}"
        self.stream.write(f"\r{line}\033[K\n" if self.live else f"{line}\n")  # \033[K: clear the bar's rest
        self.stream.flush()
