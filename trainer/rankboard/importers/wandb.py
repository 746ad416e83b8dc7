"""W&B's runs as source runs, from the `.wandb` file every run keeps in its folder (`wandb/offline-run-*/` of a run in
offline mode, `wandb/run-*/` of one that synced): its config, tags, notes, history and exit, read with W&B's own
record definitions (`wandb.proto`). Needs the `wandb` package.

The file is a log of records in LevelDB's log format behind a W&B header; W&B ships no reader of it any more (its
Python one went with wandb-core), so the framing is read here, each record's CRC checked, as W&B's was. Media
(images, histograms, tables: any logged object with a `_type`), text values, system metrics, saved files and
artifacts are counted and skipped.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

from . import Point, Reading, SourceRun, Unreadable, fitting_config, fitting_tags, read_safely

RUN_FILES = "run-*.wandb"
_IDENT, _MAGIC, _VERSION = b":W&B", 0xBEE1, 0
_FILE_HEADER = struct.Struct("<4sHB")
_RECORD_HEADER = struct.Struct("<IHB")  # CRC32 of the type byte then the data, length, type
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_TYPE_CRC = {kind: zlib.crc32(bytes([kind])) for kind in (_FULL, _FIRST, _MIDDLE, _LAST)}
_UNPRINTABLE = re.compile(r"[^\x21-\x7e]")
_MEDIA = "media and objects (images, histograms, tables...): Rankboard stores scalars"
_SKIPPED_RECORDS = {"stats": "system-metric samples (W&B's own CPU, GPU and memory readings)",
                    "files": "files saved with the run (wandb.save, media files)",
                    "artifact": "artifacts: Rankboard imports metrics, config and tags"}  # fmt: skip


def runs(folder: str | Path) -> Iterator[SourceRun | Unreadable]:
    """Every run whose `.wandb` file is in `folder` or below it (a run's folder, a `wandb/` folder, a project)."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    seen: set[Path] = set()
    for path in sorted(root.rglob(RUN_FILES)):
        if path.resolve() not in seen:  # wandb/latest-run links to a run folder already found
            seen.add(path.resolve())
            yield read_safely(str(path.relative_to(root)), lambda: _source_run(path))  # noqa: B023 - called at once


@dataclass
class _About:
    """What a run's records say of it besides its history."""

    run: Any = None  # the RunRecord
    config: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    summary_keys: set[str] = field(default_factory=set)


def _source_run(path: Path) -> SourceRun:
    about = _About()
    for record in _records(path, Reading()):
        _note(record, about)
    if about.run is None:
        raise ValueError(f"{path} holds no run record: not a W&B run file")
    run = about.run
    noted: Counter[str] = Counter()
    config = fitting_config({key: value for key, value in about.config.items() if key != "_wandb"}, noted)
    labels = [*run.tags, f"project:{run.project}" if run.project else ""]
    labels += [f"{label}:{getattr(run, name)}" for name, label in (("run_group", "group"), ("job_type", "job_type"))
               if getattr(run, name)]  # fmt: skip
    tags = fitting_tags([label for label in labels if label], noted)
    key = _UNPRINTABLE.sub("_", f"wandb:{run.entity + '/' if run.entity else ''}{run.project}/{run.run_id}")[:200]
    ending, error = ("finished", None) if about.exit_code == 0 else ("failed", _why_failed(about.exit_code))

    def read(reading: Reading) -> Iterator[Point]:
        reading.skipped.update(noted)
        logged: set[str] = set()
        for record in _records(path, reading):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                yield from _history(record.history, reading, logged)
            elif kind in _SKIPPED_RECORDS:
                reading.skipped[_SKIPPED_RECORDS[kind]] += 1
        unlogged = about.summary_keys - logged
        if unlogged:
            reading.skipped["summary values never logged as history (run.summary[...] = ...)"] += len(unlogged)

    return SourceRun(key=key, name=run.display_name or run.run_id, config=config, read=read,
                     total=path.stat().st_size, tags=tags, notes=run.notes, ending=ending, error=error)  # fmt: skip


def _why_failed(exit_code: int | None) -> str:
    if exit_code is None:
        return "the W&B run has no exit record: it crashed, or was still running"
    return f"the W&B run exited with code {exit_code}"


def _note(record: Any, about: _About) -> None:
    kind = record.WhichOneof("record_type")
    if kind == "run":
        about.run = record.run
        _update_config(about.config, record.run.config)
    elif kind == "config":
        _update_config(about.config, record.config)
    elif kind == "exit":
        about.exit_code = record.exit.exit_code
    elif kind == "summary":
        about.summary_keys |= {_top(item) for item in record.summary.update if not _top(item).startswith("_")}


def _update_config(config: dict[str, Any], record: Any) -> None:
    for item in record.update:
        config[_item_key(item)] = json.loads(item.value_json)
    for item in record.remove:
        config.pop(_item_key(item), None)


def _item_key(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else str(item.key)


def _top(item: Any) -> str:
    """The name a value was logged or summarised under: an object's fields are nested below it."""
    return str(item.nested_key[0]) if item.nested_key else str(item.key)


def _history(history: Any, reading: Reading, logged: set[str]) -> Iterator[Point]:
    """One history row's numbers at its `_step` and `_timestamp`; media (any object with a `_type`) and text are
    counted skipped."""
    logged |= {_top(item) for item in history.item}
    values = {_item_key(item): json.loads(item.value_json) for item in history.item}
    step, when = values.pop("_step", history.step.num), values.pop("_timestamp", 0.0)
    media = {key.rpartition("/")[0] for key in values if key.endswith("/_type")}
    reading.skipped[_MEDIA] += len(media)
    for key, value in values.items():
        if key.startswith("_") or key.rpartition("/")[0] in media or any(key.startswith(m + "/") for m in media):
            continue
        if isinstance(value, dict):
            yield from _nested(key, value, int(step), float(when), reading)
        elif isinstance(value, (int, float)):  # a bool too: W&B charts True as 1
            yield key, int(step), float(value), float(when)
        else:
            reading.skipped["text and other values that are no number"] += 1


def _nested(prefix: str, values: dict[str, Any], step: int, when: float, reading: Reading) -> Iterator[Point]:
    for key, value in values.items():
        name = f"{prefix}/{key}"
        if isinstance(value, dict):
            yield from _nested(name, value, step, when, reading)
        elif isinstance(value, (int, float)):
            yield name, step, float(value), when
        else:
            reading.skipped["text and other values that are no number"] += 1


def _records(path: Path, reading: Reading) -> Iterator[Any]:
    """Each record of a `.wandb` file, parsed; a record cut short or damaged ends the file, counted skipped."""
    for data in _framed(path, reading):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated, without stubs
        record.ParseFromString(data)
        yield record


def _framed(path: Path, reading: Reading) -> Iterator[bytes]:
    """The records' bytes: 32 KB blocks of chunks, each with its CRC, a record whole or as first, middle and last."""
    with path.open("rb") as file:
        if path.stat().st_size < _FILE_HEADER.size:
            raise ValueError(f"{path} is not a W&B run file: it is shorter than a header")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:  # paged in by the OS, never all held
            yield from _chunks(path, data, reading)


def _chunks(path: Path, data: mmap.mmap, reading: Reading) -> Iterator[bytes]:
    ident, magic, version = _FILE_HEADER.unpack_from(data)
    if (ident, magic, version) != (_IDENT, _MAGIC, _VERSION):
        raise ValueError(f"{path} is not a W&B run file (its header is {data[:7]!r})")
    position, parts = _FILE_HEADER.size, []
    while position + _RECORD_HEADER.size <= len(data):
        room = _BLOCK - position % _BLOCK
        if room < _RECORD_HEADER.size:  # a block's tail too short for a header is padding
            position += room
            continue
        crc, length, kind = _RECORD_HEADER.unpack_from(data, position)
        chunk = data[position + _RECORD_HEADER.size : position + _RECORD_HEADER.size + length]
        if kind == 0 and length == 0:  # zeros: the rest of a block the writer padded, or preallocated
            position += room
            continue
        if kind not in _TYPE_CRC or len(chunk) < length or zlib.crc32(chunk, _TYPE_CRC[kind]) != crc:
            reading.skipped["a damaged or cut-short last record (the run still writing, or killed)"] += 1
            return
        position += _RECORD_HEADER.size + length
        reading.done = position
        parts.append(chunk)
        if kind in (_FULL, _LAST):
            yield b"".join(parts)
            parts = []
