"""The runs table's query language: a search box, conditions on config fields and metrics, a sort and columns.

`lr < 1e-3; val_loss.min < 0.5` and `-val_loss.last` are parsed here into Condition and Sort values naming a
column of `runs` (from a fixed list) or a metric's summary; the values are bound as SQL parameters by the store
(app.store.runs_table), never written into SQL text. A mistake is a FieldInvalid naming the parameter and the problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from app.core.errors import FieldInvalid
from app.core.models import RunStatus
from app.schemas.runs import RunCreate

Op = Literal["<", "<=", ">", ">=", "=", "!="]
Stat = Literal["last", "min", "max"]
Archived = Literal["hide", "only", "all"]
STATS: tuple[Stat, ...] = ("last", "min", "max")
# What a condition, sort or column may name besides metrics: the run's own facts, and every scalar option.
FACTS = ("id", "name", "status", "created_at", "started_at", "finished_at", "created_by", "step", "epoch",
         "total_steps", "samples_per_s", "final_loss", "restarts", "attempt", "exit_code")  # fmt: skip
NOT_COLUMNS = {"allow_low_disk", "nccl_env", "script_args"}  # not stored, or not a scalar
FIELDS = tuple(dict.fromkeys([*FACTS, *(name for name in RunCreate.model_fields if name not in NOT_COLUMNS)]))
_CONDITION = re.compile(r"^\s*([A-Za-z0-9_./:-]+)\s*(<=|>=|!=|=|<|>)\s*(.*?)\s*$")
_SPLIT = re.compile(r"\s*;\s*|\s+and\s+", re.IGNORECASE)
MAX_CONDITIONS = 20
MAX_COLUMNS = 30


@dataclass(frozen=True)
class Target:
    """What a condition, sort or column names: a run field, or a metric's last, min or max."""

    field: str | None = None
    metric: str | None = None
    stat: Stat = "last"

    @property
    def label(self) -> str:
        return self.field if self.field is not None else f"{self.metric}.{self.stat}"


@dataclass(frozen=True)
class Condition:
    target: Target
    op: Op
    value: float | str | bool


@dataclass(frozen=True)
class RunQuery:
    """One view of the runs table, as its URL says it."""

    search: str = ""
    conditions: tuple[Condition, ...] = ()
    sort: Target = field(default_factory=lambda: Target(field="id"))
    descending: bool = True
    columns: tuple[Target, ...] = ()
    archived: Archived = "hide"
    status: RunStatus | None = None


def target(text: str, *, param: str) -> Target:
    """A field name, or `metric.last|min|max` (a bare metric name that is no field means its last value)."""
    if text in FIELDS:
        return Target(field=text)
    metric, dot, stat = text.rpartition(".")
    if dot and stat in STATS and metric:
        return Target(metric=metric, stat=stat)
    if not text or len(text) > 200:
        raise FieldInvalid(param, f"{param}: {text!r} is no field or metric")
    return Target(metric=text, stat="last")


def condition(text: str) -> Condition:
    """One `name op value`; a number for metrics and numeric fields, true/false for flags, else the text."""
    found = _CONDITION.match(text)
    if found is None:
        raise FieldInvalid("filter", f"filter: {text.strip()!r} is not `name op value` (op one of < <= > >= = !=)")
    name, op, raw = found.groups()
    if not raw:
        raise FieldInvalid("filter", f"filter: {text.strip()!r} has no value after {op}")
    aim = target(name, param="filter")
    return Condition(aim, op, _value(aim, raw))  # type: ignore[arg-type]


def _value(aim: Target, raw: str) -> float | str | bool:
    kind = _kind(aim)
    if kind is bool:
        if raw.lower() not in ("true", "false"):
            raise FieldInvalid("filter", f"filter: {aim.label} is true or false, not {raw!r}")
        return raw.lower() == "true"
    if kind is float:
        try:
            return float(raw)
        except ValueError:
            raise FieldInvalid("filter", f"filter: {aim.label} is a number; {raw!r} is not") from None
    return raw.strip("'\"")


def _kind(aim: Target) -> type:
    if aim.field is None:
        return float
    if aim.field in ("name", "status", "created_by", "created_at", "started_at", "finished_at"):
        return str
    annotation = str(RunCreate.model_fields[aim.field].annotation) if aim.field in RunCreate.model_fields else "int"
    if "bool" in annotation:
        return bool
    return float if ("int" in annotation or "float" in annotation) else str


def parse(
    *, search: str, filter: str, sort: str, columns: str, archived: Archived, status: RunStatus | None = None
) -> RunQuery:
    """The query a runs page or GET /api/runs asked for; FieldInvalid names what is wrong."""
    parts = [part for part in _SPLIT.split(filter.strip()) if part] if filter.strip() else []
    if len(parts) > MAX_CONDITIONS:
        raise FieldInvalid("filter", f"filter: at most {MAX_CONDITIONS} conditions")
    names = [name.strip() for name in columns.split(",") if name.strip()]
    if len(names) > MAX_COLUMNS:
        raise FieldInvalid("columns", f"columns: at most {MAX_COLUMNS}")
    descending = sort.startswith("-")
    return RunQuery(
        search=search.strip(),
        conditions=tuple(condition(part) for part in parts),
        sort=target(sort.removeprefix("-") or "id", param="sort"),
        descending=descending if sort else True,
        columns=tuple(dict.fromkeys(target(name, param="columns") for name in names)),
        archived=archived,
        status=status,
    )


def as_params(query: RunQuery) -> dict[str, str]:
    """The query as URL parameters (only those not at their default): what the page links and polls."""
    params = {
        "q": query.search,
        "filter": "; ".join(f"{c.target.label} {c.op} {_text(c.value)}" for c in query.conditions),
        "sort": ("-" if query.descending else "") + query.sort.label,
        "columns": ",".join(column.label for column in query.columns),
        "archived": query.archived,
        "status": query.status.value if query.status else "",
    }
    defaults = {"q": "", "filter": "", "sort": "-id", "columns": "", "archived": "hide", "status": ""}
    return {key: value for key, value in params.items() if value != defaults[key]}


def _text(value: float | str | bool) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else value
