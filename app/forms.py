"""The new-run form: its fields come from the API's `RunCreate`, so the page shows the limits the API enforces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from app.errors import FormInvalid
from app.schemas import RunCreate
from trainer import wire


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
    def range_text(self) -> str:
        if self.minimum is None and self.maximum is None:
            return ""
        low = "above 0" if self.minimum is None else f"{self.minimum:g}"
        return f"{low} to {self.maximum:g}" if self.maximum is not None else f"at least {low}"


LABELS = {
    "nproc_per_node": "Processes per node",
    "lr": "Learning rate",
    "checkpoint_every": "Checkpoint every",
    "init_from": "Start from checkpoint",
    "init_optimizer": "Also its optimizer state",
    "allow_low_disk": "Start even if the disk looks too small",
}


def run_form_fields(*, capacity: int) -> list[FormField]:
    """The form's fields, in the schema's order, with defaults, ranges and help text."""
    return [_field(name, prop, capacity) for name, prop in RunCreate.model_json_schema()["properties"].items()]


def _field(name: str, prop: dict[str, Any], capacity: int) -> FormField:
    label, default, help_text = (
        LABELS.get(name, name.replace("_", " ").capitalize()),
        prop["default"],
        prop["description"],
    )
    if name == "workload":
        return FormField(name, label, "select", default, help_text, choices=tuple(wire.WORKLOADS.items()))
    if "enum" in prop:
        return FormField(name, label, "select", default, help_text, choices=tuple((c, c) for c in prop["enum"]))
    kind = prop.get("type") or next(t["type"] for t in prop.get("anyOf", []) if t["type"] != "null")
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
    try:
        return RunCreate.model_validate({k: v for k, v in values.items() if k in RunCreate.model_fields})
    except ValidationError as exc:
        errors = {str(e["loc"][0]): _message(e) for e in exc.errors()}
        raise FormInvalid(errors, values) from None


def _message(error: Any) -> str:
    message = str(error["msg"])
    return message.removeprefix("Value error, ")
