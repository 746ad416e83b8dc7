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
    kind: str  # "text", "number" or "select"
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


LABELS = {"nproc_per_node": "Processes per node", "lr": "Learning rate", "checkpoint_every": "Checkpoint every"}


def run_form_fields(*, capacity: int) -> list[FormField]:
    """The form's fields, in the schema's order, with defaults, ranges and help text."""
    fields = []
    for name, prop in RunCreate.model_json_schema()["properties"].items():
        label = LABELS.get(name, name.replace("_", " ").capitalize())
        if name == "workload":
            fields.append(
                FormField(
                    name, label, "select", prop["default"], prop["description"], choices=tuple(wire.WORKLOADS.items())
                )
            )
        elif prop.get("type") == "string":
            fields.append(
                FormField(name, label, "text", prop["default"], prop["description"], maximum=prop.get("maxLength"))
            )
        else:
            maximum = min(prop["maximum"], capacity) if name == "nproc_per_node" else prop["maximum"]
            fields.append(FormField(
                name, label, "number", prop["default"], prop["description"], minimum=prop.get("minimum"),
                maximum=maximum, step="any" if prop["type"] == "number" else "1",
            ))  # fmt: skip
    return fields


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
