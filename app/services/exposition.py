"""/metrics: the server's state in Prometheus' text exposition format (version 0.0.4), written by prometheus_client.

Each scrape reads a `Snapshot` and hands it, as the one collector of a registry of its own, to `generate_latest`.
Cardinality is bounded: only live runs (starting, running, stopping) get series of their own, at most MAX_RUNS of
them (the newest), and at most MAX_GPU_SERIES GPU series among them. Counters of ingest are every server process's,
from the database's totals (app.services.ingest_totals): with `serve --workers N` a scrape reaches one worker and
counts them all, another worker's up to a second late; they count since the database was made.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from app.core.models import Run, RunStatus, utcnow
from app.services import usage
from app.services.ingest_totals import IngestTotals
from app.services.usage import Spent
from app.store import exposition as store
from app.store import metrics as metric_store

# What generate_latest writes for these names, and the header scrapers have always read here: the library's
# CONTENT_TYPE_LATEST names version 1.0.0 since 0.23, which older scrapers (Prometheus 2 among them) do not know.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
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
# The GPUs' health, where they report it (rankboard.gpu): NVML's own counts, which restart with the driver, so gauges.
GPU_HEALTH_METRICS = {
    "ecc_sbe_volatile": ("rankboard_gpu_ecc_corrected_errors", "Single-bit ECC errors since the driver loaded", 1.0),
    "ecc_dbe_volatile": ("rankboard_gpu_ecc_uncorrected_errors", "Double-bit ECC errors since the driver loaded", 1.0),
    "remap_pending": ("rankboard_gpu_row_remap_pending", "1 while a memory row remap waits for a GPU reset", 1.0),
    "remap_failure": ("rankboard_gpu_row_remap_failed", "1 once a memory row remap failed", 1.0),
    "pcie_replay": ("rankboard_gpu_pcie_replays", "PCIe replays the GPU counted", 1.0),
    "throttle": ("rankboard_gpu_clocks_event_reasons", "Why the clocks are held down: NVML's bitmask", 1.0),
    "xid": ("rankboard_gpu_last_xid", "The GPU's newest Xid error number, where it had one", 1.0),
}
MAX_GPU_HEALTH_SERIES = 3500  # 500 GPUs, seven health fields each
FIELDS_EXPORTED = [*GPU_METRICS, *GPU_HEALTH_METRICS]
# What the runs held and drew (app.services.usage): (name, what it counts, Spent's field); a run's and every run's.
SPENT_METRICS = (
    ("gpu_hours", "GPU-hours (GPUs held x wall time, from each launch)", "gpu_hours"),
    ("cpu_hours", "CPU-hours (processes x wall time, on nodes without a GPU)", "cpu_hours"),
    ("energy_joules", "GPU energy (NVML's energy counter, else the integral of sampled power)", "joules"),
)
RUN_LABELS = ("run_id", "run_name")
GPU_LABELS = ("run_id", "host", "gpu")

Sample = tuple[Sequence[str], float]  # label values in the family's order, value


@dataclass(frozen=True, eq=False)  # eq=False: a registry keys its collectors by identity
class Snapshot(Collector):
    """What one scrape shows, read in one transaction; its families come out in the order they are documented."""

    by_status: dict[RunStatus, int]
    runs: Sequence[Run]
    losses: dict[int, float | None]
    gpus: list[tuple[int, str, float | None]]  # (run_id, gpu/<host>/<index>/<field>, newest value)
    batches: int
    accepted: int
    stored: int
    spent: tuple[Spent, dict[int, Spent]] = (Spent(0.0, 0.0, 0.0), {})  # every run's in all, and each live run's

    def collect(self) -> Iterator[Metric]:
        yield from self._run_families()
        yield from self._gpu_families()
        yield from self._spent_families()
        yield CounterMetricFamily("rankboard_ingest_batches_total", "Metric batches taken by every server process",
                                  value=self.batches)  # fmt: skip
        yield CounterMetricFamily("rankboard_ingest_points_accepted_total", "Points received by every server process",
                                  value=self.accepted)  # fmt: skip
        yield CounterMetricFamily("rankboard_ingest_points_stored_total",
                                  "Points new to the store, by every server process", value=self.stored)  # fmt: skip

    def _run_families(self) -> Iterator[Metric]:
        runs = [((str(run.id), run.name), run) for run in self.runs]
        yield gauge("rankboard_runs", "Runs by status", ("status",),
                    [((s.value,), self.by_status.get(s, 0)) for s in RunStatus])  # fmt: skip
        yield gauge("rankboard_queue_length", "Runs waiting to be launched", (),
                    [((), self.by_status.get(RunStatus.queued, 0))])  # fmt: skip
        yield gauge("rankboard_run_step", "Live run's step", RUN_LABELS, [(ls, r.step) for ls, r in runs])
        yield gauge("rankboard_run_samples_per_second", "Live run's throughput", RUN_LABELS,
                    [(ls, r.samples_per_s) for ls, r in runs])  # fmt: skip
        yield gauge("rankboard_run_loss", "Live run's last loss (rank 0)", RUN_LABELS,
                    [(ls, loss) for ls, r in runs if (loss := self.losses[r.id]) is not None])  # fmt: skip

    def _gpu_families(self) -> Iterator[Metric]:
        for field, (name, help_text, divisor) in {**GPU_METRICS, **GPU_HEALTH_METRICS}.items():
            samples = [(_gpu_labels(run_id, key), value / divisor) for run_id, key, value in self.gpus
                       if key.rsplit("/", 1)[1] == field and value is not None]  # fmt: skip
            yield gauge(name, help_text, GPU_LABELS, samples)

    def _spent_families(self) -> Iterator[Metric]:
        """What the runs held and drew (app.services.usage): each live run's so far, and every run's in all."""
        total, each = self.spent
        runs = [((str(run.id), run.name), each[run.id]) for run in self.runs if run.id in each]
        for name, help_text, field in SPENT_METRICS:
            family = CounterMetricFamily(f"rankboard_run_{name}", f"Live run's {help_text} so far", labels=RUN_LABELS)
            for labels, spent in runs:
                family.add_metric(labels, getattr(spent, field))
            yield family
            yield CounterMetricFamily(f"rankboard_{name}", f"Every run's {help_text}, the live ones' so far",
                                      value=getattr(total, field))  # fmt: skip


def render(db: Session, *, counters: IngestTotals) -> bytes:
    """The whole exposition, read in one transaction (one snapshot on PostgreSQL; SQLite's driver reads each query
    afresh, so a batch stored meanwhile may show in one family and not yet in another); the ingest totals, with this
    process's counts added first, and the runs' use (app.services.usage), just before."""
    batches, accepted, stored = counters.read(db)
    spent = usage.totals(db, now=utcnow())  # its own transactions: it stores the runs it finds newly settled
    with db.begin():
        by_status = store.runs_by_status(db)
        runs = store.live_runs(db, statuses=LIVE, limit=MAX_RUNS)
        losses = {run.id: metric_store.last_value(db, run_id=run.id, key="loss") for run in runs}
        gpus = store.latest_gpu_samples(
            db, run_ids=[r.id for r in runs], fields=FIELDS_EXPORTED, limit=MAX_GPU_SERIES + MAX_GPU_HEALTH_SERIES
        )
    registry = CollectorRegistry()
    registry.register(Snapshot(by_status, runs, losses, gpus, batches, accepted, stored, spent=spent))
    return generate_latest(registry)


def gauge(name: str, help_text: str, labels: Sequence[str], samples: Iterable[Sample]) -> GaugeMetricFamily:
    """One gauge family with a sample per (label values, value)."""
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def _gpu_labels(run_id: int, key: str) -> tuple[str, str, str]:
    _, host, index, _ = key.split("/")  # gpu/<host>/<index>/<field>
    return str(run_id), host, index
