"""`rankboard import tensorboard|mlflow|wandb WHERE`: runs from another tracker, as finished runs launched elsewhere.

Each source module reads its tracker's files with that tracker's own formats (`tensorboard`, `mlflow`, `wandb`,
installed by `pip install rankboard[import]`) and gives `SourceRun`s; `upload` posts each through the REST API, the
way a script launched elsewhere reports (`report.init`): it joins a run by a key that names the source run for good
(an MLflow run id, a W&B run id, a TensorBoard run's first event file), posts every scalar point with its step and
wall time, and ends it. A run already imported and ended is skipped, so a second import stores nothing twice; an
import cut short is finished by the next (the server stores a point once per key, step and rank).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import wire
from ..report import json_safe

# One scalar point as a source reads it: (key, step, value, unix time).
Point = tuple[str, int, float, float]


@dataclass
class Reading:
    """What reading one run's points met besides them: how far it got (in the run's `total` units), and what it left
    out, counted by reason ("histograms: TensorBoard's distributions; Rankboard stores scalars")."""

    done: int = 0
    skipped: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class SourceRun:
    """One run of another tracker, read lazily: `read` yields its points in the order the source holds them."""

    key: str  # the external key: printable, no spaces, at most 200 characters, the same at every import
    name: str
    config: dict[str, Any]
    read: Callable[[Reading], Iterator[Point]]
    total: int  # the work `read` does, in its own units (bytes of files, series), for a progress bar
    tags: tuple[str, ...] = ()
    notes: str = ""
    ending: str = "exited"  # wire.ENDINGS: "finished" when the source says it completed, "failed" when it failed
    error: str | None = None  # with "failed": the source's words for why


@dataclass(frozen=True)
class Unreadable:
    """A run of the source that could not be read (a damaged file), and why: the import says so and goes on."""

    name: str
    error: str


def read_safely(name: str, make: Callable[[], SourceRun]) -> SourceRun | Unreadable:
    """The run `make` reads; Unreadable, saying why, where its files are damaged or not what they should be."""
    try:
        return make()
    except Exception as error:  # any reader's error about one run's files: the other runs are imported all the same
        return Unreadable(name, f"{type(error).__name__}: {error}")


MAX_TAG = 64  # the API's longest tag (RunLabels)
MAX_TAGS = 50


def fitting_tags(tags: list[str], skipped: Counter[str]) -> tuple[str, ...]:
    """Tags the API takes: each at most MAX_TAG characters and at most MAX_TAGS of them; the rest counted skipped."""
    kept = [tag for tag in dict.fromkeys(tags) if 0 < len(tag) <= MAX_TAG]
    if len(kept) < len(tags):
        skipped[f"tags longer than {MAX_TAG} characters, empty or repeated"] += len(tags) - len(kept)
    if len(kept) > MAX_TAGS:
        skipped[f"tags beyond the first {MAX_TAGS}"] += len(kept) - MAX_TAGS
    return tuple(kept[:MAX_TAGS])


def fitting_config(config: Mapping[str, Any], skipped: Counter[str]) -> dict[str, Any]:
    """The config as the server keeps it: NaN and infinities as strings, and, past its 64 KB, the keys in order
    while they fit (the rest counted skipped)."""
    kept: dict[str, Any] = {}
    size = 2
    for key, value in config.items():
        safe = json_safe(value)
        cost = len(json.dumps({key: safe}, default=str)) + 1
        if size + cost > wire.MAX_CONFIG_BYTES:
            skipped[f"config keys past the server's {wire.MAX_CONFIG_BYTES // 1024} KB of config"] += 1
            continue
        kept[key], size = safe, size + cost
    return kept


def typed(text: str) -> Any:
    """A parameter stored as text (MLflow's) as the number or flag it was, so that `lr < 1e-3` finds it; else the
    text: "0.001" is 0.001, "True" is true, "adam" stays "adam"."""
    if text in ("True", "False", "true", "false"):
        return text in ("True", "true")
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text
