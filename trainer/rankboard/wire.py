"""What the trainer and the server say to each other: plain dataclasses, standard library only.

The server imports this module and nothing else from `trainer/`; both sides test against it.

A metric batch is one JSON object posted to `INGEST_PATH` with `Authorization: Bearer <token>`:

    {"points": [{"key": "loss", "step": 12, "value": 0.53, "rank": 0, "time": 1763700000.0}, ...],
     "progress": {"epoch": 1, "epochs": 10, "step": 12, "total_steps": 5120, "samples_per_s": 40000.0,
                  "finished": false}}

A point is keyed `(run, key, step, rank)`: sending it twice stores it once, so a retry or a replayed spool can
never duplicate it. JSON has no NaN or infinity, so those values travel as the strings in `NON_FINITE`.

The client sends its points in the compact format instead, one set of equally long arrays per metric and rank (a
`Column`); the server takes both, so spools written by older clients still replay:

    {"columns": [{"key": "loss", "rank": 0, "steps": [12, 13], "values": [0.53, NaN], "times": [1763700000.0, ...]}]}

There NaN and infinities are written bare, as Python's json writes them (or as the strings): each value costs no work
of its own on either side, and the arrays parse ~30x faster than one object per point.

A batch may also carry, each optional:

    "node": {"host": "gpu-node-3", "gpus": [{"index": 0, "uuid": "GPU-8f1e...", "name": "NVIDIA H100"}],
             "nvml_error": null}
    "heartbeat": {"rank": 5, "host": "gpu-node-3", "step": 1200}

    "ended": {"rank": 5, "host": "gpu-node-3", "how": "failed", "error": "ValueError: ..."}
    "heartbeats": [{"rank": 5, ...}, {"rank": 6, ...}], "endings": [{"rank": 5, ...}]

A node's relay (rankboard.relay) posts its ranks' batches as one: their columns concatenated, their heartbeats and
endings in the lists (each at most MAX_RANKS_PER_BATCH); the singular fields are what one rank sends on its own.

`node` is the inventory of the node whose local rank 0 samples its GPUs (`rankboard.gpu`), sent when it changes;
`nvml_error` says why a node samples CPU and memory instead (then `gpus` is empty). The server keeps one per host
in the run's `gpus`. The samples themselves are ordinary points keyed `GPU_KEY` / `SYS_KEY`, at step = unix
seconds, from the sampling rank. `heartbeat` is one rank's own "alive at this step", which every rank sends at
most every couple of seconds and only when its step moved, so that a rank that hangs while the others wait in a
collective shows as the one whose heartbeat went stale. `ended` comes only from a run launched elsewhere (see
below), once per process, as its last batch: how that rank's process ended, since no launcher sees it exit.

A run launched elsewhere (the user's own sbatch, torchrun or Kubernetes job) has no RANKBOARD_RUN_ID. Each of its
processes POSTs a `Join` to `JOIN_PATH` with the user's API token; all the processes that give one key (the job's
Slurm id, torchrun's rendezvous id, or the user's own) share one run, and each gets back the run's id and a token
of its own for the ingest endpoint:

    {"key": "slurm:cluster-a:81234", "name": "llama-ft", "config": {"lr": 0.0003}, "rank": 0, "world_size": 16,
     "local_world_size": 8, "host": "gpu-node-3", "takes_stop": true}
    -> {"run_id": 42, "token": "...", "created": true}

The ingest reply then carries {"stop": true} once someone asked the run to stop: a script that said it takes a
stop (`takes_stop`) reads it through `report.stop_requested()`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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
JOIN_PATH = "/api/runs/external"
# A run launched elsewhere finds the server the way the CLI does; RANKBOARD_TOKEN is then the user's API token.
ENV_URL = "RANKBOARD_URL"
ENV_RUN_NAME = "RANKBOARD_RUN_NAME"
ENV_RUN_KEY = "RANKBOARD_RUN_KEY"  # the user's own key, where the job's scheduler gives none that all ranks share
ENDINGS = ("finished", "exited", "failed")  # how an external run's process ended: report.finished(), or not, or raised
MAX_CONFIG_BYTES = 65_536  # an external run's config, as JSON
FINISHED_MARKER = "trainer-finished.json"  # rank 0 writes it in the run folder when training completed
# Each worker's client leaves it beside torchrun's error file (<log dir>/<rdzv>_<random>/attempt_<n>/<local rank>/):
# {"rank", "local_rank", "group_rank", "node"}. c10d numbers agents in rendezvous order, so only the worker itself
# knows which global rank a folder of a multi-node run belongs to.
RANK_MARKER = "rank.json"
# The client's spool files in the run folder: one batch per line, exactly as it would have been posted.
SPOOL_GLOB = "spool-*.jsonl"

# Checkpoints, in the run's checkpoint folder. Rank 0 writes `step-00000512.pt` and then, once it is in place, its
# sidecar `step-00000512.json` (a `CheckpointSidecar`), each by an atomic rename. The server reads only the sidecars,
# never a .pt; a .pt whose sidecar is missing (a crash between the two renames) is still listed, without metrics,
# because it is complete and loads.
CHECKPOINT_GLOB = "step-*.pt"
CHECKPOINT_SIDECAR_GLOB = "step-*.json"
# Why a checkpoint was written: an epoch boundary, every N steps (checkpoint_unit "step"), a stop request, the end.
CHECKPOINT_REASONS = ("epoch", "step", "stop", "final")
CHECKPOINT_METRICS = ("loss", "epoch_loss")  # a sidecar's metrics; lower is better for both
# The trainer's retention appends one JSON line per checkpoint it deleted, in the checkpoint folder ("freed": bytes
# of the .pt and its sidecar that were still there):
#     {"removed": "step-00000064.pt", "step": 64, "freed": 929115, "at": 1763700000.0,
#      "policy": {"keep_last": 1, "keep_best": 1, "best_metric": "epoch_loss"}}
RETENTION_LOG = "retention.jsonl"

# The built-in workloads `python -m trainer --workload NAME` accepts, with what a person sees in the form.
WORKLOADS = {
    "mlp": "MLP classifier on synthetic data (65,536 samples, 32 features, 10 classes)",
    "cnn": "CNN with BatchNorm on synthetic 16x16 images (16,384 samples, 10 classes)",
    "charlm": "Character-level transformer language model on a generated corpus (16,384 windows of 64)",
}

# The trainer's choices, which the server's form and API offer as they are.
OPTIMIZERS = ("adamw", "adam", "sgd")  # sgd with momentum 0.9
LR_SCHEDULES = ("constant", "cosine")  # both after a linear warm-up of warmup_steps
PRECISIONS = ("off", "bf16", "fp16")  # autocast dtypes; fp16 with a GradScaler, and only on CUDA
CHECKPOINT_UNITS = ("epoch", "step")  # what checkpoint_every counts
# The NCCL variables a run may set; anything else in its environment stays the launcher's.
NCCL_ENV = (
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_HCA",
    "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_BUFFSIZE", "NCCL_NSOCKS_PERTHREAD",
    "NCCL_SOCKET_NTHREADS", "NCCL_ALGO", "NCCL_PROTO", "NCCL_ASYNC_ERROR_HANDLING",
)  # fmt: skip


def node_name(environ: Mapping[str, str], host: str) -> str:
    """The name a node's samples, inventory and heartbeats go under: its host, and the Slurm task too where
    several torchrun agents share one host (each would otherwise overwrite the other's inventory and samples)."""
    per_node = environ.get("SLURM_TASKS_PER_NODE", "1").split("(")[0].split(",")[0]
    task = environ.get("SLURM_LOCALID")
    if task is not None and per_node.isdigit() and int(per_node) > 1:
        host = f"{host[: MAX_HOST_LENGTH - 8]}:{task[:7]}"
    return host[:MAX_HOST_LENGTH]


def seconds_from_env(
    environ: Mapping[str, str], name: str, default: float, least: float, most: float = math.inf
) -> tuple[float, str | None]:
    """The seconds variable `name` sets, brought within least..most (the default when unset or not a number), and
    what was wrong with it, for the caller to warn of: None when nothing was."""
    raw = environ.get(name)
    try:
        seconds = float(raw) if raw else default
    except ValueError:
        seconds = math.nan
    if seconds != seconds:
        return default, f"{name}={raw!r} is not a number"
    within = min(max(seconds, least), most)
    if within == seconds:
        return within, None
    bounds = f"outside {least:g} to {most:g} s" if most < math.inf else f"under {least:g} s"
    return within, f"{name}={raw} is {bounds}"


def flag_value(value: object) -> str:
    """An option's value as `python -m trainer` takes it on its command line: booleans as true/false."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def cuda_only(*, precision: str, sync_batchnorm: bool) -> dict[str, str]:
    """The options among these that work only on CUDA devices, each with why: {option: reason}."""
    reasons = {
        "precision": "fp16 needs CUDA GPUs (its gradient scaler is for GPUs); on CPUs use bf16 or off",
        "sync_batchnorm": "SyncBatchNorm runs only on CUDA GPUs; on CPUs each rank keeps its own BatchNorm statistics",
    }
    chosen = {"precision": precision == "fp16", "sync_batchnorm": sync_batchnorm}
    return {option: reasons[option] for option, on in chosen.items() if on}


MAX_KEY_LENGTH = 200
# Steps are 64-bit columns on every database (GPU samples count steps in unix seconds, past 2**31 in 2038; long
# runs count far): a larger one is refused with 422, never stored on one database and failing on the other.
MAX_STEP = 2**62
MAX_EPOCH = 2**31 - 1  # a 32-bit column on PostgreSQL
MAX_RANK = 1_000_000
MAX_POINTS_PER_BATCH = 10_000
MAX_HOST_LENGTH = 100  # a host name in keys and inventories; keeps the longest GPU key well under MAX_KEY_LENGTH
MAX_GPUS_PER_NODE = 64
MAX_RANKS_PER_BATCH = 4 * MAX_GPUS_PER_NODE  # heartbeats (and endings) in one batch: a node's ranks, relayed as one
MAX_NVML_ERROR_LENGTH = 500

# A node's GPU samples: `gpu/<host>/<index>/<field>`, the index as NVML numbers the GPU on that host. Each field
# with its unit. run_mem: memory held on that GPU by this run's own processes (the others may be someone else's).
GPU_KEY = "gpu/{host}/{index}/{field}"
GPU_FIELDS = {
    "util": "%",
    "mem_used": "bytes",
    "mem_total": "bytes",
    "temp": "°C",
    "power": "W",
    "power_limit": "W",
    "sm_clock": "MHz",
    "run_mem": "bytes",
    # GPU health, where the GPU has it (a field it lacks is never sent). ECC: single-bit (corrected) and double-bit
    # (uncorrected) errors since the driver loaded (volatile) and over the GPU's life (aggregate).
    "ecc_sbe_volatile": "errors",
    "ecc_dbe_volatile": "errors",
    "ecc_sbe_aggregate": "errors",
    "ecc_dbe_aggregate": "errors",
    "remap_corrected": "rows",  # Ampere and later remap rows of bad memory ...
    "remap_uncorrected": "rows",
    "remap_pending": "flag",  # 1: a remap waits for the GPU's reset
    "remap_failure": "flag",  # 1: a remap failed; the GPU needs service
    "retired_pending": "flag",  # ... older GPUs retire pages: 1 when a retirement waits for a reboot
    "throttle": "bitmask",  # nvmlDeviceGetCurrentClocksEventReasons; see CLOCK_REASONS
    "pcie_replay": "replays",
    "nvlink_replay": "errors",  # each NVLink error counter summed over the GPU's links
    "nvlink_recovery": "errors",
    "nvlink_crc_flit": "errors",
    "nvlink_crc_data": "errors",
    "nvlink_ecc_data": "errors",
    "energy": "J",  # NVML's total-energy counter: since the driver loaded; read once a minute
    "xid": "Xid",  # a point per Xid error, at its second: the Xid's number (see XID_MEANINGS)
    # GPM (Hopper and later), over the last sample period: what utilization cannot tell apart (a spinning kernel reads
    # 100% utilization; its tensor pipes stay idle).
    "sm_active": "%",
    "sm_occupancy": "%",
    "tensor_active": "%",
    "dram_bw": "%",
}
# The clock-event (throttle) reasons that explain a slow GPU, by their bit in the `throttle` field (NVML's
# nvmlClocksEventReason* values); the others (idle, application clocks, sync boost, display) are no trouble.
CLOCK_REASONS = {
    0x4: ("power cap", "software power cap"),
    0x8: ("HW slowdown", "hardware slowdown"),
    0x20: ("thermal", "software thermal slowdown"),
    0x40: ("thermal", "hardware thermal slowdown"),
    0x80: ("HW slowdown", "hardware power brake"),
}
HW_SLOWDOWN_BITS = 0x8 | 0x40 | 0x80  # what the GPU itself forced: never a setting, always worth explaining
# NVIDIA's meanings of the Xids that matter most to training (NVIDIA's Xid catalogue, shortened).
XID_MEANINGS = {
    13: "graphics engine exception (often a bug or illegal memory access in a kernel)",
    31: "GPU memory page fault (often an illegal address in a kernel)",
    43: "GPU stopped processing (a kernel was killed)",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (the application must restart)",
    95: "uncontained ECC error (the GPU must be reset)",
    119: "GSP RPC timeout (the GPU's system processor stopped answering)",
    120: "GSP error",
}


def xid_meaning(xid: int) -> str:
    """NVIDIA's meaning of an Xid, or a pointer to its catalogue for the ones not listed here."""
    return XID_MEANINGS.get(xid, "see NVIDIA's Xid catalogue")


# A node without NVML samples the host instead: `sys/<host>/<field>`.
SYS_KEY = "sys/{host}/{field}"
SYS_FIELDS = {"cpu_percent": "%", "mem_used": "bytes", "mem_total": "bytes"}
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
class Column:
    """The points of one metric from one rank, as equally long arrays: the compact format of a batch's points."""

    key: str
    rank: int
    steps: list[int]
    values: list[float]
    times: list[float]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "rank": self.rank, "steps": self.steps, "values": self.values, "times": self.times}


@dataclass(frozen=True)
class Progress:
    """Where training stands; every batch may carry one, and it doubles as the trainer's heartbeat."""

    epoch: int
    epochs: int
    step: int
    total_steps: int
    samples_per_s: float = 0.0
    finished: bool = False
    restart: int = 0  # torchrun's TORCHELASTIC_RESTART_COUNT: how many times the workers were restarted


@dataclass(frozen=True)
class Gpu:
    """One GPU of a node, as NVML names it."""

    index: int  # NVML's index on its host (what CUDA_VISIBLE_DEVICES counts, with CUDA_DEVICE_ORDER=PCI_BUS_ID)
    uuid: str
    name: str


@dataclass(frozen=True)
class Node:
    """What one node samples: its GPUs, or why it has none (NVML missing, no driver) and samples CPU instead."""

    host: str
    gpus: tuple[Gpu, ...] = ()
    nvml_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "gpus": [asdict(gpu) for gpu in self.gpus], "nvml_error": self.nvml_error}


@dataclass(frozen=True)
class Heartbeat:
    """One rank says it is alive, on this host, at this step."""

    rank: int
    host: str
    step: int


@dataclass(frozen=True)
class Ended:
    """How one process of a run launched elsewhere ended: one of ENDINGS, with the exception's line if it raised."""

    rank: int
    host: str
    how: str
    error: str | None = None


@dataclass(frozen=True)
class Join:
    """One process of a run launched elsewhere asks to report into the run of its job's `key`."""

    key: str
    name: str
    config: dict[str, Any]
    rank: int
    world_size: int
    local_world_size: int
    host: str
    takes_stop: bool = False
    checkpoint_dir: str | None = None  # absolute: where the script saves its checkpoints (named as CHECKPOINT_GLOB)
    total_steps: int | None = None  # the steps the script declared it will train (report.init); None: not declared

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Batch:
    """What one POST to the ingest endpoint carries."""

    points: tuple[Point, ...] = ()
    progress: Progress | None = None
    node: Node | None = None
    heartbeat: Heartbeat | None = None
    ended: Ended | None = None
    columns: tuple[Column, ...] = ()
    heartbeats: tuple[Heartbeat, ...] = ()  # several ranks' (a node's relay); at most MAX_RANKS_PER_BATCH
    endings: tuple[Ended, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The batch as a JSON object; with columns, NaN and infinities in them stay floats (json.dumps writes them
        bare), so dump it with allow_nan left on."""
        body: dict[str, Any] = {"points": [p.to_json() for p in self.points]}
        if self.columns:
            body["columns"] = [column.to_json() for column in self.columns]
        if self.progress is not None:
            body["progress"] = asdict(self.progress)
        if self.node is not None:
            body["node"] = self.node.to_json()
        if self.heartbeat is not None:
            body["heartbeat"] = asdict(self.heartbeat)
        if self.ended is not None:
            body["ended"] = asdict(self.ended)
        if self.heartbeats:
            body["heartbeats"] = [asdict(beat) for beat in self.heartbeats]
        if self.endings:
            body["endings"] = [asdict(ending) for ending in self.endings]
        return body


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint written at this step: `step-00000512.pt`."""
    return f"step-{step:08d}.pt"


def sidecar_name(checkpoint: str) -> str:
    """The name of a checkpoint's metadata file: `step-00000512.pt` -> `step-00000512.json`."""
    return checkpoint.removesuffix(".pt") + ".json"


def checkpoint_step(name: str) -> int | None:
    """The step in a checkpoint's or sidecar's file name, or None for any other name (temporary files included)."""
    for suffix in (".pt", ".json"):
        if name.startswith("step-") and name.endswith(suffix):
            digits = name[len("step-") : -len(suffix)]
            return int(digits) if digits.isascii() and digits.isdigit() else None
    return None


@dataclass(frozen=True)
class CheckpointSidecar:
    """What a checkpoint's `step-*.json` says about it, so that listing checkpoints never loads one."""

    file: str  # the checkpoint's name, in the same folder
    step: int
    epoch: int
    metrics: dict[str, float]  # CHECKPOINT_METRICS, each averaged over the ranks
    size: int  # bytes of the .pt
    written_at: float  # unix time
    reason: str  # one of CHECKPOINT_REASONS

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["metrics"] = {key: encode_value(value) for key, value in self.metrics.items()}
        return body

    @classmethod
    def from_json(cls, body: Any) -> CheckpointSidecar:
        """Read a decoded sidecar; raises ValueError when it is not one."""
        try:
            sidecar = cls(
                file=str(body["file"]),
                step=int(body["step"]),
                epoch=int(body["epoch"]),
                metrics={str(key): decode_value(value) for key, value in body["metrics"].items()},
                size=int(body["size"]),
                written_at=float(body["written_at"]),
                reason=str(body["reason"]),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            raise ValueError(f"not a checkpoint sidecar: {type(error).__name__}: {error}") from None
        if checkpoint_step(sidecar.file) != sidecar.step or not sidecar.file.endswith(".pt"):
            raise ValueError(f"not a checkpoint sidecar: file {sidecar.file!r} does not match step {sidecar.step}")
        return sidecar


# Dumps of every rank ("which rank, and why"; rankboard/forensics.py, app/services/forensics.py). While a dump is
# requested, the server's reply to any ingest POST carries `DUMP_REPLY_FIELD` with the request's number:
#     {"accepted": 0, "stored": 0, "dump": 3}
# and each rank's reporter thread, which runs while the main thread blocks in a collective, answers that number once
# with a `RankDump` posted to DUMP_PATH (with the run's token). No field, no cost: a reply without it is not parsed.
DUMP_PATH = "/api/runs/{run_id}/dumps/{request}"
DUMP_REPLY_FIELD = "dump"
DUMP_REPLY_MARK = b'"dump":'  # what the client looks for in a reply before it parses it
MAX_DUMP_BYTES = 2_000_000
MAX_DUMP_FRAMES = 64  # of the main thread, most recent first
MAX_DUMP_COLLECTIVES = 20  # the flight recorder's newest entries
# The ranks' environment: their flight recorder keeps this many collectives (a ring; the dump sends the newest).
FR_BUFFER_ENV = {"TORCH_FR_BUFFER_SIZE": "2000"}
# The first non-finite values the built-in trainer saw (trainer/watch.py), as points: at the step where each became
# NaN or infinite; the loss once per rank that had it (its value on that rank), the gradient norm (the same on every
# rank: DDP averaged the gradients) from rank 0.
NONFINITE_LOSS_KEY = "forensics/nonfinite_loss"
# The first fingerprint step at which a rank's parameters differed from the others' (trainer/watch.py), one point per
# rank that differed, its value the difference of its fingerprint from the reference ranks'.
DIVERGENCE_KEY = "forensics/divergence"


def divergence_sentence(step: int, ranks: list[int]) -> str:
    """ "rank 1's parameters differ from the other ranks' at step 200 (first seen)"."""
    which = f"rank {ranks[0]}'s" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}'"
    return f"{which} parameters differ from the other ranks' at step {step:,} (first seen; replicas diverged)"


# Each rank's mean step, data-wait and compute milliseconds per step, which the built-in trainer gathers to rank 0
# every RANK_TIMES_EVERY steps and reports under each rank (a script may report them too): stragglers are read there.
RANK_TIME_KEYS = ("rank/step_ms", "rank/data_ms", "rank/compute_ms")
RANK_TIMES_EVERY = 20
NONFINITE_GRAD_NORM_KEY = "forensics/nonfinite_grad_norm"


def number_word(value: float) -> str:
    """A value as a sentence names it: NaN, inf, -inf, or the number."""
    if math.isnan(value):
        return "NaN"
    return ("inf" if value > 0 else "-inf") if math.isinf(value) else f"{value:g}"


def nonfinite_sentence(step: int, ranks: list[int], loss: str, norm_step: int | None, norm: str) -> str:
    """The trainer's log line and the run page's sentence: "loss became NaN at step 1,234 on rank 2 first (grad
    norm inf one step earlier)"."""
    where = f"rank {ranks[0]} first" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} at once"
    if norm_step is None or norm_step > step:
        after = "grad norm still finite"
    elif norm_step == step:
        after = f"grad norm {norm} at the same step"
    else:
        gap = step - norm_step
        after = f"grad norm {norm} {'one step' if gap == 1 else f'{gap:,} steps'} earlier"
    return f"loss became {loss} at step {step:,} on {where} ({after})"


# Faults the tests inject into the built-in trainer, "KIND:rank=R:step=S[:ms=M]" with KIND hang, nan, slow_data or
# perturb (trainer/faults.py: Fault); never set by the dashboard.
ENV_TEST_FAULT = "RANKBOARD_TEST_FAULT"


@dataclass(frozen=True)
class Frame:
    """One frame of a Python stack."""

    file: str
    line: int
    function: str


@dataclass(frozen=True)
class Collective:
    """One entry of a rank's flight recorder: a collective it entered, numbered in the process group."""

    seq: int
    name: str  # profiling name, such as "gloo:all_reduce"
    sizes: str  # input sizes, as the recorder gives them


@dataclass(frozen=True)
class RankDump:
    """What one rank sends for one dump request: its main thread's stack, every thread's as faulthandler prints it,
    its flight recorder's newest collectives (empty, with `recorder_error` saying why, where it has none), and
    whether it still moved on in the seconds after: ranks answer at different moments, so their sequence numbers
    alone are no picture of one moment (trainer/rankboard/forensics.py `Watch`)."""

    request: int
    rank: int
    host: str
    pid: int
    taken_at: float
    stack: tuple[Frame, ...]  # the main thread, most recent call first
    threads: str
    collectives: tuple[Collective, ...] = ()
    recorder_error: str | None = None
    step: int | None = None  # its newest heartbeat step when the stack was taken; None: it sends none
    watched_s: float | None = None  # how long after `taken_at` it then watched its collectives and its step
    moved: bool | None = None  # whether either went on within watched_s; None: it had neither to watch

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# Goodput: each rank's ledger of where its process's time went, reported every GOODPUT_REPORT_S and at the end as
# ordinary points keyed `goodput/<attempt>/<field>` under the rank's own rank, at step = the ledger's report number
# (1, 2, ...: each report's totals replace the one before). `<attempt>` names one process incarnation: the launch id's
# first 8 characters, a dot, torchrun's restart count. Fields: each of GOODPUT_PARTS (seconds since the process
# started, cumulative), and GOODPUT_MARKS: `start` and `at` (unix times: the process's start, these totals' moment),
# `first_step` (the step this incarnation began after) and `step` (the last one it finished).
GOODPUT_KEY = "goodput/{attempt}/{field}"
GOODPUT_REPORT_S = 2.0
GOODPUT_PARTS = (
    "startup_launch",  # from the process's creation to the trainer's entry point: interpreter, imports
    "startup_group",  # joining the process group
    "startup_build",  # building the data, the model, the optimizer; loading a snapshot
    "startup_preflight",  # the preflight check (trainer.preflight)
    "data",  # waiting for the next batch
    "step",  # forward, backward, all-reduce, optimizer: the training itself
    "checkpoint",  # writing checkpoints, and the ranks waiting for rank 0 to finish one
    "validation",  # evaluating on the validation set
)
GOODPUT_MARKS = ("start", "at", "first_step", "step_reached")


# Preflight (trainer/preflight.py): before the first step, each launch's rank 0 leaves this in the run folder.
PREFLIGHT_FILE = "preflight.json"
PREFLIGHT_MODES = ("warn", "refuse", "off")  # refuse: a mismatch or a slow rank stops the run before training
PREFLIGHT_FIELDS = ("python", "torch", "cuda", "nccl", "driver", "gpu")


@dataclass(frozen=True)
class Mismatch:
    """One rank's value of a fingerprint field that differs from the most common one."""

    field: str
    rank: int
    value: str
    common: str


@dataclass(frozen=True)
class Preflight:
    """Every rank's fingerprint and all-reduce bus bandwidth (GB/s; None with one rank), and what stands out."""

    fingerprints: list[dict[str, str]]
    bus_gbps: list[float | None]
    bytes: int
    mismatches: list[Mismatch]
    slow_ranks: list[int]
    seconds: float
    at: float  # unix time
    refused: bool = False

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.slow_ranks

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: Any) -> Preflight:
        """Read a decoded preflight file; raises ValueError when it is not one."""
        try:
            return cls(
                fingerprints=[{str(k): str(v) for k, v in p.items()} for p in body["fingerprints"]],
                bus_gbps=[None if s is None else float(s) for s in body["bus_gbps"]],
                bytes=int(body["bytes"]),
                mismatches=[
                    Mismatch(str(m["field"]), int(m["rank"]), str(m["value"]), str(m["common"]))
                    for m in body["mismatches"]
                ],
                slow_ranks=[int(r) for r in body["slow_ranks"]],
                seconds=float(body["seconds"]),
                at=float(body["at"]),
                refused=bool(body.get("refused", False)),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            raise ValueError(f"not a preflight result: {type(error).__name__}: {error}") from None


# A run's model FLOPs per training sample (forward and backward), logged once under this key at any step; with the
# run's samples/s it gives the FLOP/s achieved, and on a GPU model FLOPs utilization. The built-in trainer logs it
# at its first step; a script can too: `report.log({wire.MODEL_FLOPS_KEY: flops}, step=0)`.
MODEL_FLOPS_KEY = "model_flops_per_sample"
