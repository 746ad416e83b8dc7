"""Which charts a run page shows, in which sections: every metric key the run has, each in exactly one chart.

The layout is decided here, once, and handed to the page as JSON per figure: the browser only draws what it is told,
and asks for the page's `charts` fragment again when a key it has not seen arrives. A few keys are drawn together
where one chart reads better than two (loss with validation loss; samples/s with tokens/s; each GPU field with a line
per GPU and its total or limit dashed; each host field with a line per host; the per-rank timings the straggler view
reads together); every other key gets a chart of its own, titled by its key.

Sections follow the keys' first path component as W&B and TensorBoard group them: `train/loss` and `train/acc` in
"train", bare keys in a first section, and the dashboard's own families (`rank/`, `gpu/`, `sys/`, `goodput/`,
`forensics/`) after the user's. Within a section, charts of loss-like keys come first, then by key; the dashboard's
own sections keep their hardware order (utilization before memory before power) ahead of any other key.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from rankboard import wire
from sqlalchemy.orm import Session

from app.core.models import Run
from app.store import metrics as metric_store

GPU_KEY = re.compile(r"^gpu/(?P<host>[^/]+)/(?P<index>\d+)/(?P<field>[a-z_]+)$")
SYS_KEY = re.compile(r"^sys/(?P<host>[^/]+)/(?P<field>[a-z_]+)$")
GOODPUT_PART = re.compile(rf"^goodput/[^/]+/(?:{'|'.join(wire.GOODPUT_PARTS)})$")

# The families the dashboard itself writes (trainer/, the client's GPU sampler and goodput ledger), in page order
# after the user's own sections, with the heading each gets.
OWN_SECTIONS = {"rank": "Per rank", "gpu": "GPUs", "sys": "Hosts", "goodput": "Goodput", "forensics": "Forensics"}
FOLDED_SECTIONS = {"goodput", "forensics"}  # the ledger's running sums, each attempt's own: opened when wanted
TOP_SECTION = "Metrics"  # the heading of the bare keys' section
UNORDERED = 1_000  # the place of a chart no curated order names: after the curated ones, by key

# Per-rank timings read together (id, title, [(key, label, dashed)]): the straggler view compares them per rank.
RANK_CHARTS = [
    ("step-time", "Step time", [("rank/step_ms", "step", False)]),
    ("step-parts", "Data wait and compute", [("rank/data_ms", "data wait", True),
                                             ("rank/compute_ms", "compute", False)]),
    ("comm", "Exposed all-reduce per step", [("rank/comm_ms", "exposed all-reduce", False),
                                             ("rank/backward_ms", "backward", True)]),
]  # fmt: skip


@dataclass(frozen=True)
class Family:
    """Devices sampled at unix seconds (a node's GPUs, or its host): a chart per field, a line per device."""

    noun: str  # "GPU" or "Host", in the titles of fields without a curated chart
    pattern: re.Pattern[str]
    units: dict[str, str]
    # The fields in page order: (chart id, title, field, its total or limit drawn dashed, that line's label words).
    known: list[tuple[str, str, str, str | None, str]]


GPUS = Family("GPU", GPU_KEY, wire.GPU_FIELDS, [
    ("gpu-util", "GPU utilization", "util", None, ""),
    ("gpu-memory", "GPU memory (used and total)", "mem_used", "mem_total", "mem total"),
    ("gpu-power", "GPU power (and its limit)", "power", "power_limit", "power limit"),
    ("gpu-temp", "GPU temperature", "temp", None, ""),
    ("gpu-sm-clock", "GPU SM clock", "sm_clock", None, ""),
    ("gpu-run-mem", "GPU memory held by this run", "run_mem", None, ""),
    ("gpu-energy", "GPU energy counter (since its driver loaded)", "energy", None, ""),
    ("gpu-sm-active", "GPU SMs active (GPM; occupancy dashed)", "sm_active", "sm_occupancy", "occupancy"),
    ("gpu-tensor-active", "GPU tensor pipes active (GPM)", "tensor_active", None, ""),
    ("gpu-dram-bw", "GPU DRAM bandwidth used (GPM)", "dram_bw", None, ""),
    # The GPU's health: each a count NVML keeps, drawn where the GPU has it (the Host page says where it does not).
    ("gpu-xid", "GPU Xid errors (each point an Xid, by its number)", "xid", None, ""),
    ("gpu-throttle", "GPU clock-event reasons (bits: 4 power cap, 8 HW slowdown, 32/64 thermal, 128 power brake)",
     "throttle", None, ""),
    ("gpu-ecc-volatile", "GPU ECC errors since the driver loaded (double-bit dashed)", "ecc_sbe_volatile",
     "ecc_dbe_volatile", "double-bit"),
    ("gpu-ecc-aggregate", "GPU ECC errors over its life (double-bit dashed)", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
     "double-bit"),
    ("gpu-remapped-rows", "GPU remapped rows (uncorrectable dashed)", "remap_corrected", "remap_uncorrected",
     "uncorrectable"),
    ("gpu-remap-state", "GPU row remap pending (failed dashed)", "remap_pending", "remap_failure", "failed"),
    ("gpu-retired-pending", "GPU page retirement pending", "retired_pending", None, ""),
    ("gpu-pcie-replay", "GPU PCIe replays", "pcie_replay", None, ""),
])  # fmt: skip
HOSTS = Family("Host", SYS_KEY, wire.SYS_FIELDS, [
    ("cpu", "CPU", "cpu_percent", None, ""),
    ("host-memory", "Host memory (used and total)", "mem_used", "mem_total", "total"),
])  # fmt: skip


@dataclass(frozen=True)
class ChartSeries:
    """One metric drawn on a chart; the page draws one line per rank that reports it (or their mean, or rank 0)."""

    key: str
    label: str
    color: int = 0  # index into the page's palette: a GPU's used and total memory share one
    dashed: bool = False  # a limit or a total, drawn behind the value it bounds


@dataclass(frozen=True)
class Chart:
    """One chart: `time` when its steps are unix seconds (GPU and host samples).

    `start` is the first step the chart asks for. For time charts it is when the run was created: asked from step 0,
    the range would span 1970 to now and every sample of the run would fall into one bucket.
    """

    id: str  # DOM-safe, and the same for the same keys on every load: links name charts by it
    title: str
    unit: str
    series: list[ChartSeries]
    time: bool = False
    start: int = 0

    @property
    def keys(self) -> list[str]:
        return [s.key for s in self.series]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ChartSection:
    """A foldable group of charts: the keys' first path component ("" for bare keys), a DOM-safe id, a heading."""

    name: str
    id: str
    title: str
    charts: list[Chart]
    folded: bool = False  # folded until opened: the dashboard's bookkeeping (goodput's ledger, forensics)


@dataclass(frozen=True)
class RunCharts:
    """The page's sections of charts, why a node has no GPU charts, the keys they were made from, and the stream's
    start; `started` (unix seconds) is where the charts' "time since start" axis counts from."""

    sections: list[ChartSection]
    no_gpu: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    last_point_id: int = 0
    started: float = 0.0

    @property
    def charts(self) -> list[Chart]:
        return [chart for section in self.sections for chart in section.charts]


def run_charts(db: Session, *, run: Run) -> RunCharts:
    """The charts of `run` as its page loads; the stream starts after the newest point stored now."""
    keys = metric_store.series_keys(db, run_id=run.id)
    last_point_id = metric_store.last_point_id(db)
    created = run.created_at.timestamp()
    started = run.started_at.timestamp() if run.started_at else created
    sections = layout(keys, time_start=int(created))
    return RunCharts(sections, no_gpu_notes(keys, run.gpus or []), keys, last_point_id, started)


def layout(keys: Iterable[str], *, time_start: int = 0) -> list[ChartSection]:
    """The sections of charts for these keys, each key in exactly one chart, in the page's order."""
    present = set(keys)
    placed = _curated(present, time_start)
    taken = {key for chart, _ in placed for key in chart.keys}
    placed += [(_own_chart(key, time_start), UNORDERED) for key in sorted(present - taken)]
    by_section: dict[str, list[tuple[Chart, int]]] = {}
    for chart, order in placed:
        by_section.setdefault(section_of(chart.keys[0]), []).append((chart, order))
    return [_section(name, by_section[name]) for name in _section_order(by_section)]


def section_of(key: str) -> str:
    """The section a key belongs to: its first path component, or "" for a bare key."""
    head, slash, _ = key.partition("/")
    return head if slash else ""


def dom_id(prefix: str, text: str) -> str:
    """An id for `text` that is safe in HTML, CSS selectors and URLs, and the same on every load: a readable slug (its
    ASCII letters and digits) and a short hash of the whole text, so `a/b` and `a-b` (or two unicode keys) differ."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text).strip("-")[:40].strip("-")
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{prefix}-{slug}-{digest}" if slug else f"{prefix}-{digest}"


def _section(name: str, placed: list[tuple[Chart, int]]) -> ChartSection:
    own = name in OWN_SECTIONS  # the dashboard's sections keep their curated order; the user's are by key

    def place(item: tuple[Chart, int]) -> tuple[bool, int, str]:
        chart, order = item
        return not _loss_like(chart), order if own else 0, chart.keys[0].casefold()

    ordered = [chart for chart, _ in sorted(placed, key=place)]
    title = TOP_SECTION if not name else OWN_SECTIONS.get(name, name)
    return ChartSection(name, "top" if not name else dom_id("s", name), title, ordered, name in FOLDED_SECTIONS)


def _section_order(names: Iterable[str]) -> list[str]:
    """The bare keys first, then the user's own sections by name, then the dashboard's in their fixed order."""
    present = set(names)
    user = sorted(present - set(OWN_SECTIONS) - {""})
    return [name for name in ["", *user, *OWN_SECTIONS] if name in present]


def _loss_like(chart: Chart) -> bool:
    return any("loss" in key.lower() for key in chart.keys)


def _own_chart(key: str, time_start: int) -> Chart:
    """The chart of a key no curated chart takes: titled by its key, in the unit its family implies."""
    time = key.startswith(("gpu/", "sys/"))  # sampled at unix seconds
    return Chart(dom_id("k", key), key, _unit(key), [ChartSeries(key, key)], time, time_start if time else 0)


def _unit(key: str) -> str:
    if m := GPU_KEY.match(key):
        return wire.GPU_FIELDS.get(m["field"], "")
    if m := SYS_KEY.match(key):
        return wire.SYS_FIELDS.get(m["field"], "")
    if GOODPUT_PART.match(key):
        return "s"
    return "ms" if key.startswith("rank/") and key.endswith("_ms") else ""


def _curated(present: set[str], start: int) -> list[tuple[Chart, int]]:
    """The charts that draw several keys together, each with its place among its section's curated charts."""
    top = [
        Chart("loss", "Loss", "", [ChartSeries("loss", "train loss"), ChartSeries("val_loss", "validation loss", 1)]),
        Chart("lr", "Learning rate", "", [ChartSeries("lr", "learning rate")]),
        Chart("throughput", "Throughput", "/s",
              [ChartSeries("samples_per_s", "samples/s"), ChartSeries("tokens_per_s", "tokens/s", 1)]),
    ]  # fmt: skip
    ranks = [
        Chart(chart_id, title, "ms", [ChartSeries(key, label, 0, dashed) for key, label, dashed in series])
        for chart_id, title, series in RANK_CHARTS
    ]
    kept = [_only_present(chart, present) for chart in [*top, *ranks]]
    charts = [chart for chart in kept if chart.series] + _hardware_charts(present, start)
    return [(chart, order) for order, chart in enumerate(charts)]


def _only_present(chart: Chart, present: set[str]) -> Chart:
    return Chart(chart.id, chart.title, chart.unit, [s for s in chart.series if s.key in present], chart.time)


def _hardware_charts(present: set[str], start: int) -> list[Chart]:
    """A chart per GPU field (a line per GPU) and per host field (a line per host), known fields first."""
    gpus = sorted({(m["host"], int(m["index"])) for k in present if (m := GPU_KEY.match(k))})
    hosts = sorted({m["host"] for k in present if (m := SYS_KEY.match(k))})
    charts = [
        *_field_charts(GPUS, [(f"{host} GPU {index}", f"gpu/{host}/{index}/") for host, index in gpus], present, start),
        *_field_charts(HOSTS, [(host, f"sys/{host}/") for host in hosts], present, start),
    ]
    return [chart for chart in charts if chart.series]


def _field_charts(family: Family, devices: list[tuple[str, str]], present: set[str], start: int) -> list[Chart]:
    """One chart per field of a family: the known fields in their order, then any other field by name."""
    named = {f for _, _, value, limit, _ in family.known for f in (value, limit) if f}
    others = sorted({m["field"] for k in present if (m := family.pattern.match(k))} - named)
    prefix = family.noun.lower()
    specs = family.known + [(dom_id(prefix, f), f"{family.noun} {f.replace('_', ' ')}", f, None, "") for f in others]
    return [
        Chart(chart_id, title, family.units.get(value, ""), _device_series(devices, present, value, limit, words),
              True, start)
        for chart_id, title, value, limit, words in specs
    ]  # fmt: skip


def _device_series(
    devices: list[tuple[str, str]], present: set[str], value: str, limit: str | None, words: str
) -> list[ChartSeries]:
    """A line per device for `value`, and its `limit` dashed in the same colour."""
    out = []
    for color, (label, prefix) in enumerate(devices):
        if prefix + value in present:
            out.append(ChartSeries(prefix + value, label, color))
        if limit is not None and prefix + limit in present:
            out.append(ChartSeries(prefix + limit, f"{label} {words}", color, True))
    return out


def no_gpu_notes(keys: list[str], nodes: list[dict[str, Any]]) -> list[str]:
    """ "No NVIDIA GPU found on <host>: <reason>" for each node that sampled its CPU instead of GPUs."""
    reasons = {str(node["host"]): str(node["nvml_error"]) for node in nodes if node.get("nvml_error")}
    for key in keys:
        if (m := SYS_KEY.match(key)) and m["host"] not in reasons:
            reasons[m["host"]] = "it reported its CPU and memory instead"
    return [f"No NVIDIA GPU found on {host}: {reason}" for host, reason in sorted(reasons.items())]
