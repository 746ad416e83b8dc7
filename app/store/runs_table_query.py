"""The runs table's query language: a search box, conditions on a run's fields, its config and its metrics, a sort
and columns.

`lr < 1e-3; val_loss.min < 0.5` and `-val_loss.last` are parsed here into Condition and Sort values naming a
column of `runs` (from a fixed list), a key of the run's config document (a trainer option by its name, any key as
`config.<key>`, a nested one as `config.<key>.<key>`), or a metric's summary; the values are bound as SQL parameters
by the store (app.store.runs_table), never written into SQL text. A mistake is a FieldInvalid naming the parameter
and the problem. It runs no SQL, but it lives beside that store because the store takes its values: the services and
the routes above only parse with it and read it back.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from app.core.errors import FieldInvalid
from app.core.models import RunStatus
from app.core.trainer_options import OPTION_NAMES
from app.schemas.runs import RunCreate

Op = Literal["<", "<=", ">", ">=", "=", "!="]
Stat = Literal["last", "min", "max"]
Archived = Literal["hide", "only", "all"]
STATS: tuple[Stat, ...] = ("last", "min", "max")
# What a condition, sort or column may name besides metrics and config keys: the run's own facts, and every scalar
# column of a run that RunCreate sets.
FACTS = ("id", "name", "status", "created_at", "started_at", "finished_at", "created_by", "step", "epoch",
         "total_steps", "samples_per_s", "final_loss", "restarts", "attempt", "exit_code")  # fmt: skip
NOT_COLUMNS = {"allow_low_disk", "nccl_env", "script_args"}  # not stored, or not a scalar
COLUMNS = tuple(dict.fromkeys([*FACTS, *(n for n in RunCreate.model_fields if n not in {*NOT_COLUMNS, *OPTION_NAMES})]))
FIELDS = (*COLUMNS, *OPTION_NAMES)  # what a name alone may be: a column, or a key of the config document
CONFIG = "config."  # before any key of the config document: `config.dropout`, `config.optim.lr`
_CONDITION = re.compile(r"^\s*([A-Za-z0-9_./:-]+)\s*(<=|>=|!=|=|<|>)\s*(.*?)\s*$")
_SPLIT = re.compile(r"\s*;\s*|\s+and\s+", re.IGNORECASE)
_KEY = re.compile(r"^[A-Za-z0-9_:/-]{1,100}(\.[A-Za-z0-9_:/-]{1,100}){0,7}$")  # no quote: a JSON path is bound as text
MAX_CONDITIONS = 20
MAX_COLUMNS = 30


@dataclass(frozen=True)
class Target:
    """What a condition, sort or column names: a run field, a key of its config document (a path into it: `optim.lr`
    is ("optim", "lr")), or a metric's last, min or max."""

    field: str | None = None
    metric: str | None = None
    stat: Stat = "last"
    config: tuple[str, ...] | None = None

    @property
    def label(self) -> str:
        if self.config is not None:
            key = ".".join(self.config)
            return key if key in OPTION_NAMES else CONFIG + key
        return self.field if self.field is not None else f"{self.metric}.{self.stat}"

    @property
    def kind(self) -> type | None:
        """What its values are: bool, float or str; None for a config key no option names (each run's own)."""
        if self.metric is not None:
            return float
        if self.config is not None:
            return _option_kind(self.config[0]) if len(self.config) == 1 and self.config[0] in OPTION_NAMES else None
        if self.field in ("name", "status", "created_by", "created_at", "started_at", "finished_at"):
            return str
        return _option_kind(self.field or "") if self.field in RunCreate.model_fields else float


def _option_kind(name: str) -> type:
    annotation = str(RunCreate.model_fields[name].annotation)
    if "bool" in annotation:
        return bool
    return float if ("int" in annotation or "float" in annotation) else str


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
    """A field name, a trainer option's name, `config.<key>`, or `metric.last|min|max` (a bare metric name that is
    none of the others means its last value)."""
    if text in COLUMNS:
        return Target(field=text)
    if text in OPTION_NAMES:
        return Target(config=(text,))
    if text.startswith(CONFIG):
        if (path := config_path(key := text.removeprefix(CONFIG))) is None:
            raise FieldInvalid(param, f"{param}: {key[:100]!r} is no config key (letters, digits, _ : / -, by .)")
        return Target(config=path)
    metric, dot, stat = text.rpartition(".")
    if dot and stat in STATS and metric:
        return Target(metric=metric, stat=stat)
    if not text or len(text) > 200:
        raise FieldInvalid(param, f"{param}: {text!r} is no field or metric")
    return Target(metric=text, stat="last")


def config_path(key: str) -> tuple[str, ...] | None:
    """The path into a config document that `key` names (`optim.lr`: ("optim", "lr")); None if it cannot be one."""
    return tuple(key.split(".")) if _KEY.match(key) else None


def condition(text: str) -> Condition:
    """One `name op value`; a number for metrics and numeric fields, true/false for flags, else the text. A config
    key no option names takes the value's own kind: true/false, a number, or else text."""
    found = _CONDITION.match(text)
    if found is None:
        raise FieldInvalid("filter", f"filter: {text.strip()!r} is not `name op value` (op one of < <= > >= = !=)")
    name, op, raw = found.groups()
    if not raw:
        raise FieldInvalid("filter", f"filter: {text.strip()!r} has no value after {op}")
    aim = target(name, param="filter")
    return Condition(aim, op, _value(aim, raw))  # type: ignore[arg-type]


def _value(aim: Target, raw: str) -> float | str | bool:
    kind = aim.kind or _kind_of(raw)
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


def _kind_of(raw: str) -> type:
    """The kind of a value compared with a key each run's script named: true/false, a number, else text."""
    if raw.lower() in ("true", "false"):
        return bool
    try:
        return float if math.isfinite(float(raw)) else str
    except ValueError:
        return str


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
        "filter": "; ".join(f"{c.target.label} {c.op} {_text(c)}" for c in query.conditions),
        "sort": ("-" if query.descending else "") + query.sort.label,
        "columns": ",".join(column.label for column in query.columns),
        "archived": query.archived,
        "status": query.status.value if query.status else "",
    }
    defaults = {"q": "", "filter": "", "sort": "-id", "columns": "", "archived": "hide", "status": ""}
    return {key: value for key, value in params.items() if value != defaults[key]}


def _text(condition: Condition) -> str:
    value = condition.value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    # Text compared with a script's own key, that would read as a number or a flag without its quotes.
    return f'"{value}"' if condition.target.kind is None and _kind_of(value) is not str else value
