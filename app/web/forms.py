"""The new-run form: its fields come from the API's `RunCreate`, so the page shows the limits the API enforces."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError
from rankboard import wire

from app.core.errors import FormInvalid
from app.core.models import Run
from app.core.option_text import as_form_text
from app.launcher.launchers import kind
from app.schemas.runs import RunCreate, RunDetail


@dataclass(frozen=True)
class FormField:
    name: str
    label: str
    kind: str  # "text", "number", "select" or "checkbox"
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    step: str = "1"
    choices: tuple[tuple[str, str], ...] = ()

    @property
    def wide(self) -> bool:
        return self.name in WIDE

    def differs(self, value: object) -> bool:
        """Whether a value of the form's is other than this field's default, both as the form writes them."""
        return _as_text(value) != _as_text(self.default)

    @property
    def range_text(self) -> str:
        if self.kind == "text":  # its maximum is a length
            return f"at most {_number(self.maximum)} characters" if self.maximum else ""
        if self.minimum is None and self.maximum is None:
            return ""
        low = "above 0" if self.minimum is None else _number(self.minimum)
        return f"{low} to {_number(self.maximum)}" if self.maximum is not None else f"at least {low}"


def _as_text(value: object) -> str:
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _number(value: float) -> str:
    """10000000 as "10,000,000" rather than "1e+07"; a fraction as itself."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


LABELS = {
    "nproc_per_node": "Processes per node",
    "lr": "Learning rate",
    "lr_schedule": "Learning-rate schedule",
    "grad_accum": "Gradient accumulation",
    "grad_clip": "Gradient clipping",
    "val_every": "Validate every",
    "sync_batchnorm": "SyncBatchNorm",
    "bucket_cap_mb": "DDP bucket size (MiB)",
    "pg_timeout_s": "Process-group timeout (s)",
    "preflight": "Preflight check",
    "nccl_env": "NCCL environment",
    "script": "Your own script",
    "script_args": "Script arguments",
    "checkpoint_every": "Checkpoint every",
    "init_from": "Start from checkpoint",
    "init_optimizer": "Also its optimizer state",
    "allow_low_disk": "Start even if the disk looks too small",
    "launcher": "Run on",
    "slurm_nodes": "Nodes",
    "slurm_gpus_per_node": "GPUs per node",
    "slurm_cpus_per_task": "CPUs per task",
    "slurm_time_limit": "Time limit",
    "slurm_partition": "Partition",
    "slurm_account": "Account",
    "slurm_qos": "QoS",
    "slurm_constraint": "Constraint",
    "slurm_requeue": "Requeue when preempted or out of time",
    "slurm_max_requeues": "Requeues at most",
    "priority": "Priority",
    "preemptible": "May be preempted (it resumes)",
}


@dataclass(frozen=True)
class FormGroup:
    """One section of the form: its title, its fields in the schema's order, and whether it starts folded."""

    title: str
    fields: list[FormField]
    folded: bool = False
    opened_by: tuple[str, str] | None = None  # the field, and its value, that unfold it (Run on: slurm)


# The form's sections, in order: what a user decides first, open; the rest folded. A field in none goes to the last.
GROUPS = {
    "What to run": ("name", "workload", "script", "script_args"),
    "Resources": ("launcher", "nproc_per_node", "priority", "preemptible"),
    "Slurm job": ("slurm_nodes", "slurm_gpus_per_node", "slurm_cpus_per_task", "slurm_time_limit", "slurm_partition",
                  "slurm_account", "slurm_qos", "slurm_constraint", "slurm_requeue", "slurm_max_requeues"),
    "Training": ("epochs", "batch_size", "lr", "optimizer", "lr_schedule", "warmup_steps", "weight_decay", "grad_clip",
                 "grad_accum", "precision", "val_every", "seed"),
    "Checkpoints": ("checkpoint_every", "checkpoint_unit", "keep_last", "keep_best", "best_metric", "init_from",
                    "init_optimizer", "allow_low_disk"),
    "Advanced: DDP, NCCL, desync checks": (),
}  # fmt: skip
FOLDED = {"Slurm job", "Advanced: DDP, NCCL, desync checks"}
OPENED_BY = {"Slurm job": ("launcher", "slurm")}
WIDE = {"name", "workload", "script", "script_args", "init_from", "nccl_env"}  # a whole row: long choices, paths, lists


def run_form_fields(*, capacity: int, partitions: dict[str, int] | None = None) -> list[FormField]:
    """The form's fields, in the schema's order, with defaults, ranges and help text. `partitions` are the Slurm
    cluster's, with their node counts; None where this server cannot submit to Slurm, whose fields are then left out."""
    fields = [_field(name, prop, capacity) for name, prop in RunCreate.model_json_schema()["properties"].items()]
    if partitions is None:  # this host is the only place to run
        only_here = (("local", "local"),)
        fields = [f for f in fields if not f.name.startswith("slurm_")]
        return [replace(f, choices=only_here) if f.name == "launcher" else f for f in fields]
    offered = (("", "the server's default"), *((name, f"{nodes} nodes") for name, nodes in sorted(partitions.items())))
    return [replace(f, kind="select", choices=offered) if f.name == "slurm_partition" else f for f in fields]


def run_form_groups(*, capacity: int, partitions: dict[str, int] | None = None) -> list[FormGroup]:
    """The form's fields by section, each section in the schema's order; a section with no field here is left out
    (Slurm's, where this server cannot submit to Slurm)."""
    fields = run_form_fields(capacity=capacity, partitions=partitions)
    placed = {name for names in GROUPS.values() for name in names}
    groups = [
        FormGroup(
            title,
            [f for f in fields if (f.name in names if names else f.name not in placed)],
            title in FOLDED,
            OPENED_BY.get(title),
        )
        for title, names in GROUPS.items()
    ]
    return [group for group in groups if group.fields]


def _field(name: str, prop: dict[str, Any], capacity: int) -> FormField:
    label, default, help_text = (
        LABELS.get(name, name.replace("_", " ").capitalize()),
        prop.get("default"),  # none for a default_factory: an empty list or mapping
        prop["description"],
    )
    if name == "workload":
        return FormField(name, label, "select", default, help_text, choices=tuple(wire.WORKLOADS.items()))
    if "enum" in prop:
        return FormField(name, label, "select", default, help_text, choices=tuple((c, c) for c in prop["enum"]))
    kind = prop.get("type") or next(t["type"] for t in prop.get("anyOf", []) if t["type"] != "null")
    if kind in ("object", "array"):  # nccl_env, script_args: one entry per line
        return FormField(name, label, "lines", "", help_text)
    if kind == "boolean":
        return FormField(name, label, "checkbox", default, help_text)
    if kind == "string":
        length = prop.get("maxLength") or max((t.get("maxLength", 0) for t in prop.get("anyOf", [])), default=None)
        return FormField(name, label, "text", default or "", help_text, maximum=length)
    maximum = min(prop["maximum"], capacity) if name == "nproc_per_node" else prop["maximum"]
    return FormField(name, label, "number", default, help_text, minimum=prop.get("minimum"), maximum=maximum,
                     step="any" if kind == "number" else "1")  # fmt: skip


def parse_run_form(values: dict[str, str]) -> RunCreate:
    """A RunCreate from the form's strings; raises FormInvalid with a message for each wrong field."""
    fields: dict[str, object] = {k: v for k, v in values.items() if k in RunCreate.model_fields}
    # An unchecked box sends nothing: one checked by default (preemptible) that is missing was unchecked.
    fields |= {name: "false" for name, info in RunCreate.model_fields.items() if info.default is True
               and name not in values}  # fmt: skip
    errors = {}
    if "script_args" in fields:
        fields["script_args"] = _lines(values["script_args"])
    if "nccl_env" in fields:
        pairs = [line.partition("=") for line in _lines(values["nccl_env"])]
        fields["nccl_env"] = {name.strip(): value.strip() for name, _eq, value in pairs}
        if any(not eq for _name, eq, _value in pairs):
            errors["nccl_env"] = "write one NAME=value per line, for example NCCL_DEBUG=INFO"
    try:
        spec = RunCreate.model_validate(fields, strict=False)  # a form posts strings: "3" is 3, "true" is true
    except ValidationError as exc:
        errors = {str(e["loc"][0]): _message(e) for e in exc.errors()} | errors
        raise FormInvalid(errors, values) from None
    if errors:
        raise FormInvalid(errors, values)
    return spec


def like_refusal(run: Run | RunDetail) -> str | None:
    """Why "New run like this" cannot start a run like this one; None where it can (a built-in workload, or a script
    with its arguments: the form holds everything the run was started with)."""
    if kind(run.launcher).joins:  # its processes joined the run: their command is known only where they started
        return "it was launched elsewhere, and Rankboard does not know its command"
    return None


def form_values_like(run: Run) -> dict[str, str]:
    """ "New run like this": the form filled with what the run had; the options it never had keep their defaults. A
    script's run: its script, its arguments and its processes, so that the form starts the same command again."""
    return as_form_text(RunCreate.values_of(run))


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _message(error: Any) -> str:
    message = str(error["msg"])
    return message.removeprefix("Value error, ")
