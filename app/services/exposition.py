"""/metrics: the server's state in Prometheus' text exposition format (version 0.0.4), written out here.

Cardinality is bounded: only live runs (starting, running, stopping) get series of their own, at most MAX_RUNS of
them (the newest), and at most MAX_GPU_SERIES GPU series among them. Counters of ingest are this process's own and
restart from 0 with it, which Prometheus' rate() expects of a counter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import partial

from sqlalchemy.orm import Session

from app.core.models import RunStatus
from app.services.metrics import IngestCounters
from app.store import exposition as store
from app.store import metrics as metric_store

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LIVE = (RunStatus.starting, RunStatus.running, RunStatus.stopping)
MAX_RUNS = 100
MAX_GPU_SERIES = 2000  # 500 GPUs, four fields each
# Each GPU field exported: (metric name, help, what to divide by for the metric's unit).
GPU_METRICS = {
    "util": ("rankboard_gpu_utilization_ratio", "GPU utilization (0-1), newest sample", 100.0),
    "mem_used": ("rankboard_gpu_memory_used_bytes", "GPU memory used, newest sample", 1.0),
    "mem_total": ("rankboard_gpu_memory_total_bytes", "GPU memory in all, newest sample", 1.0),
    "power": ("rankboard_gpu_power_watts", "GPU power draw, newest sample", 1.0),
}

Sample = tuple[dict[str, str], float]


def render(db: Session, *, counters: IngestCounters) -> str:
    """The whole exposition, read in one transaction (one snapshot on PostgreSQL; SQLite's driver reads each query
    afresh, so a batch stored meanwhile may show in one family and not yet in another)."""
    with db.begin():
        by_status = store.runs_by_status(db)
        runs = store.live_runs(db, statuses=LIVE, limit=MAX_RUNS)
        losses = {run.id: metric_store.last_value(db, run_id=run.id, key="loss") for run in runs}
        gpus = store.latest_gpu_samples(
            db, run_ids=[r.id for r in runs], fields=list(GPU_METRICS), limit=MAX_GPU_SERIES
        )
    labels = {run.id: {"run_id": str(run.id), "run_name": run.name} for run in runs}
    out: list[str] = []
    gauge = partial(family, out, kind="gauge")
    gauge("rankboard_runs", "Runs by status", [({"status": s.value}, by_status.get(s, 0)) for s in RunStatus])
    gauge("rankboard_queue_length", "Runs waiting to be launched", [({}, by_status.get(RunStatus.queued, 0))])
    gauge("rankboard_run_step", "Live run's step", [(labels[r.id], r.step) for r in runs])
    gauge("rankboard_run_samples_per_second", "Live run's throughput", [(labels[r.id], r.samples_per_s) for r in runs])
    gauge("rankboard_run_loss", "Live run's last loss (rank 0)",
          [(labels[r.id], loss) for r in runs if (loss := losses[r.id]) is not None])  # fmt: skip
    for field, (name, help_text, divisor) in GPU_METRICS.items():
        gauge(name, help_text, [(_gpu_labels(run_id, key), value / divisor) for run_id, key, value in gpus
                                if key.rsplit("/", 1)[1] == field and value is not None])  # fmt: skip
    counter = partial(family, out, kind="counter")
    counter("rankboard_ingest_batches_total", "Metric batches taken since the server started", [({}, counters.batches)])
    counter("rankboard_ingest_points_accepted_total", "Points received since the server started",
            [({}, counters.accepted)])  # fmt: skip
    counter("rankboard_ingest_points_stored_total", "Points new to the store since the server started",
            [({}, counters.stored)])  # fmt: skip
    return "".join(out)


def _gpu_labels(run_id: int, key: str) -> dict[str, str]:
    _, host, index, _ = key.split("/")  # gpu/<host>/<index>/<field>
    return {"run_id": str(run_id), "host": host, "gpu": index}


def family(out: list[str], name: str, help_text: str, samples: Iterable[Sample], *, kind: str) -> None:
    """Appends one metric family: its HELP and TYPE lines, then a line per sample."""
    out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
    for labels, value in samples:
        pairs = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
        out.append(f"{name}{{{pairs}}} {number(value)}\n" if pairs else f"{name} {number(value)}\n")


def escape(value: str) -> str:
    """A label value as the format quotes it: backslash, double quote and line feed escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() or abs(value) >= 1e15 else str(int(value))
