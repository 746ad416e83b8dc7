"""What the trainer and the server say to each other: plain dataclasses, standard library only.

The server imports this module and nothing else from `trainer/`; both sides test against it.

A metric batch is one JSON object posted to `INGEST_PATH` with `Authorization: Bearer <token>`:

    {"points": [{"key": "loss", "step": 12, "value": 0.53, "rank": 0, "time": 1763700000.0}, ...],
     "progress": {"epoch": 1, "epochs": 10, "step": 12, "total_steps": 5120, "samples_per_s": 40000.0,
                  "finished": false}}

A point is keyed `(run, key, step, rank)`: sending it twice stores it once, so a retry or a replayed spool can
never duplicate it. JSON has no NaN or infinity, so those values travel as the strings in `NON_FINITE`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# The environment a launcher gives every rank; without RUN_ID the client is a silent no-op.
ENV_RUN_ID = "RANKBOARD_RUN_ID"
ENV_SERVER_URL = "RANKBOARD_SERVER_URL"
ENV_TOKEN = "RANKBOARD_TOKEN"
ENV_RUN_DIR = "RANKBOARD_RUN_DIR"  # per-run folder on shared storage: rank logs, the client's spool
ENV_CHECKPOINT_DIR = "RANKBOARD_CHECKPOINT_DIR"
ENV_LAUNCH_ID = "RANKBOARD_LAUNCH_ID"  # unique per launch; finds every process of a run, orphans included

INGEST_PATH = "/api/runs/{run_id}/metrics"
FINISHED_MARKER = "trainer-finished.json"  # rank 0 writes it in the run folder when training completed
# The client's spool files in the run folder: one batch per line, exactly as it would have been posted.
SPOOL_GLOB = "spool-*.jsonl"

# The built-in workloads `python -m trainer --workload NAME` accepts, with what a person sees in the form.
WORKLOADS = {"mlp": "MLP classifier on synthetic data (65,536 samples, 32 features, 10 classes)"}

MAX_KEY_LENGTH = 200
MAX_POINTS_PER_BATCH = 10_000
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def encode_value(value: float) -> float | str:
    """A float as JSON can carry it: finite numbers as themselves, NaN and infinities as strings."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def decode_value(value: float | str) -> float:
    """The inverse of `encode_value`; raises ValueError for any other string."""
    if isinstance(value, str):
        if value not in NON_FINITE:
            raise ValueError(f"expected a number or one of {sorted(NON_FINITE)}, got {value!r}")
        return NON_FINITE[value]
    return float(value)


@dataclass(frozen=True)
class Point:
    """One value of one metric at one step, from one rank."""

    key: str
    step: int
    value: float
    rank: int = 0
    time: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "step": self.step,
            "value": encode_value(self.value),
            "rank": self.rank,
            "time": self.time,
        }


@dataclass(frozen=True)
class Progress:
    """Where training stands; every batch may carry one, and it doubles as the trainer's heartbeat."""

    epoch: int
    epochs: int
    step: int
    total_steps: int
    samples_per_s: float = 0.0
    finished: bool = False


@dataclass(frozen=True)
class Batch:
    """What one POST to the ingest endpoint carries."""

    points: tuple[Point, ...] = ()
    progress: Progress | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"points": [p.to_json() for p in self.points]}
        if self.progress is not None:
            body["progress"] = asdict(self.progress)
        return body
