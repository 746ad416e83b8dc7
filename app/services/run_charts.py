"""Which charts a run page shows, from the metric keys the run has and its nodes' GPU inventories.

The layout is decided here, once, and handed to the page as JSON: the browser only draws what it is told, and asks
for the page's `charts` fragment again when a key it has not seen arrives. Charts for keys the run does not have
are left out, so a CPU-only run shows no empty GPU panels and a user's own script shows only what it logs.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from app.core.models import Run
from app.store import metrics as metric_store

GPU_KEY = re.compile(r"^gpu/(?P<host>[^/]+)/(?P<index>\d+)/(?P<field>[a-z_]+)$")
SYS_KEY = re.compile(r"^sys/(?P<host>[^/]+)/(?P<field>[a-z_]+)$")


@dataclass(frozen=True)
class ChartSeries:
    """One metric drawn on a chart; `per_rank` draws one line per rank that reports it."""

    key: str
    label: str
    color: int = 0  # index into the page's palette: a GPU's used and total memory share one
    dashed: bool = False  # a limit or a total, drawn behind the value it bounds
    per_rank: bool = False


@dataclass(frozen=True)
class Chart:
    """One chart: `time` when its steps are unix seconds (GPU and host samples).

    `start` is the first step the chart asks for. For time charts it is when the run was created: asked from step 0,
    the range would span 1970 to now and every sample of the run would fall into one bucket.
    """

    id: str
    title: str
    unit: str
    series: list[ChartSeries]
    time: bool = False
    start: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunCharts:
    """The page's charts, why a node has no GPU charts, the keys they were made from, and the stream's start."""

    charts: list[Chart]
    no_gpu: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    last_point_id: int = 0


def run_charts(db: Session, *, run: Run) -> RunCharts:
    """The charts of `run` as its page loads; the stream starts after the newest point stored now."""
    keys = metric_store.series_keys(db, run_id=run.id)
    last_point_id = metric_store.last_point_id(db)
    created = int(run.created_at.timestamp())
    return RunCharts(layout(keys, time_start=created), no_gpu_notes(keys, run.gpus or []), keys, last_point_id)


def layout(keys: list[str], *, time_start: int = 0) -> list[Chart]:
    """The charts for these keys, in the page's order: training first, then each rank, then the hardware."""
    present = set(keys)
    wanted = [
        Chart("loss", "Loss", "", [ChartSeries("loss", "train loss"), ChartSeries("val_loss", "validation loss", 1)]),
        Chart("lr", "Learning rate", "", [ChartSeries("lr", "learning rate")]),
        Chart("throughput", "Throughput", "/s",
              [ChartSeries("samples_per_s", "samples/s"), ChartSeries("tokens_per_s", "tokens/s", 1)]),
        Chart("step-time", "Step time per rank", "ms", [ChartSeries("rank/step_ms", "step", per_rank=True)]),
        Chart("step-parts", "Data wait and compute per rank", "ms",
              [ChartSeries("rank/data_ms", "data wait", dashed=True, per_rank=True),
               ChartSeries("rank/compute_ms", "compute", per_rank=True)]),
        Chart("comm", "Exposed all-reduce per step, per rank (trainer/comm.py)", "ms",
              [ChartSeries("rank/comm_ms", "exposed all-reduce", per_rank=True),
               ChartSeries("rank/backward_ms", "backward", dashed=True, per_rank=True)]),
    ]  # fmt: skip
    charts = [chart for chart in wanted if any(s.key in present for s in chart.series)]
    charts = [Chart(c.id, c.title, c.unit, [s for s in c.series if s.key in present]) for c in charts]
    return charts + _hardware_charts(present, time_start)


def _hardware_charts(present: set[str], start: int) -> list[Chart]:
    gpus = sorted({(m["host"], int(m["index"])) for k in present if (m := GPU_KEY.match(k))})
    hosts = sorted({m["host"] for k in present if (m := SYS_KEY.match(k))})

    def gpu_series(field: str, limit: str | None = None) -> list[ChartSeries]:
        out = []
        for color, (host, index) in enumerate(gpus):
            label, key = f"{host} GPU {index}", f"gpu/{host}/{index}/{field}"
            if key in present:
                out.append(ChartSeries(key, label, color))
            if limit is not None and f"gpu/{host}/{index}/{limit}" in present:
                out.append(
                    ChartSeries(f"gpu/{host}/{index}/{limit}", f"{label} {limit.replace('_', ' ')}", color, True)
                )
        return out

    def sys_series(field: str, limit: str | None = None) -> list[ChartSeries]:
        out = []
        for color, host in enumerate(hosts):
            if f"sys/{host}/{field}" in present:
                out.append(ChartSeries(f"sys/{host}/{field}", host, color))
            if limit is not None and f"sys/{host}/{limit}" in present:
                out.append(ChartSeries(f"sys/{host}/{limit}", f"{host} total", color, True))
        return out

    candidates = [
        Chart("gpu-util", "GPU utilization", "%", gpu_series("util"), True, start),
        Chart("gpu-memory", "GPU memory (used and total)", "bytes", gpu_series("mem_used", "mem_total"), True, start),
        Chart("gpu-power", "GPU power (and its limit)", "W", gpu_series("power", "power_limit"), True, start),
        Chart("cpu", "CPU", "%", sys_series("cpu_percent"), True, start),
        Chart("host-memory", "Host memory (used and total)", "bytes", sys_series("mem_used", "mem_total"), True, start),
    ]
    return [chart for chart in candidates if chart.series]


def no_gpu_notes(keys: list[str], nodes: list[dict[str, Any]]) -> list[str]:
    """ "No NVIDIA GPU found on <host>: <reason>" for each node that sampled its CPU instead of GPUs."""
    reasons = {str(node["host"]): str(node["nvml_error"]) for node in nodes if node.get("nvml_error")}
    for key in keys:
        if (m := SYS_KEY.match(key)) and m["host"] not in reasons:
            reasons[m["host"]] = "it reported its CPU and memory instead"
    return [f"No NVIDIA GPU found on {host}: {reason}" for host, reason in sorted(reasons.items())]
