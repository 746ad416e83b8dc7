"""TensorBoard's event files as source runs: every scalar, with its step and wall time; hyperparameters (the HParams
plugin's) as the config. Needs the `tensorboard` package, whose protocol buffers and HParams reader it uses.

A run is the shallowest folder under the one imported that holds event files itself, with every folder below it:
PyTorch's `SummaryWriter.add_scalars("loss", {"train": ..., "val": ...})` writes each series into a subfolder
`loss_train/` of its own, imported as the key `loss/train`; `add_hparams` writes its hyperparameters into a
subfolder too, imported as the run's config. Images, histograms, audio, text and graphs are counted and skipped.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.util import tensor_util

from . import Point, Reading, SourceRun, Unreadable, fitting_config, read_safely

EVENT_FILES = "*tfevents*"
_HEADER = struct.Struct("<QI")  # a TFRecord: length, its CRC, the data, the data's CRC
_CHUNK = 1 << 22
_PEEK_EVENTS = 1000  # where a writer puts its hyperparameters: among its file's first events
# What a summary value holds besides a scalar, as a person names it, by its field or by the plugin that wrote it.
_SKIPPED = {
    "histo": "histograms", "image": "images", "audio": "audio", "histograms": "histograms", "images": "images",
    "text": "text", "pr_curves": "PR curves", "mesh": "meshes", "custom_scalars": "custom scalar layouts",
}  # fmt: skip


def runs(folder: str | Path) -> Iterator[SourceRun | Unreadable]:
    """The runs under `folder`, in the order of their paths."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    for run_dir in _run_folders(root):
        files = sorted(path for path in run_dir.rglob(EVENT_FILES) if path.is_file())
        name = root.name if run_dir == root else run_dir.relative_to(root).as_posix()
        yield read_safely(name, lambda: _source_run(run_dir, name, files))  # noqa: B023 - called at once


def _run_folders(folder: Path) -> Iterator[Path]:
    if any(path.is_file() for path in folder.glob(EVENT_FILES)):
        yield folder
        return
    for child in sorted(path for path in folder.iterdir() if path.is_dir()):
        yield from _run_folders(child)


def _source_run(run_dir: Path, name: str, files: list[Path]) -> SourceRun:
    # The oldest event file names the run for good: its name holds its writer's time, host and pid, and it stays
    # where it is under the run's folder wherever that folder is moved.
    first = min(files, key=lambda path: (path.name, path.relative_to(run_dir).as_posix()))
    digest = hashlib.sha256(first.relative_to(run_dir).as_posix().encode()).hexdigest()[:32]
    hyperparameters = {key: value for path in files for key, value in _hyperparameters(path).items()}
    trimmed = Reading()
    config = fitting_config(hyperparameters, trimmed.skipped)

    def read(reading: Reading) -> Iterator[Point]:
        reading.skipped.update(trimmed.skipped)
        for path in files:
            yield from _scalars(path, _prefix(path.parent.relative_to(run_dir)), reading)

    return SourceRun(key=f"tensorboard:{digest}", name=name, config=config, read=read,
                     total=sum(path.stat().st_size for path in files))  # fmt: skip


def _prefix(folder: Path) -> str:
    return "" if folder == Path() else folder.as_posix() + "/"


def _key(prefix: str, tag: str) -> str:
    """A series' key: its tag under its subfolder; add_scalars' `<tag>_<name>/` folder holding `tag` is `tag/name`."""
    head, _, last = prefix.rstrip("/").rpartition("/")
    if last.startswith(tag + "_") and len(last) > len(tag) + 1:
        return f"{head + '/' if head else ''}{tag}/{last[len(tag) + 1 :]}"
    return prefix + tag


def _scalars(path: Path, prefix: str, reading: Reading) -> Iterator[Point]:
    """The scalars of one event file; the rest counted skipped."""
    plugins: dict[str, str] = {}  # a tensor summary names its plugin on its tag's first value only
    for record in _records(path, reading):
        event = event_pb2.Event.FromString(record)
        if event.HasField("graph_def") or event.HasField("meta_graph_def"):
            reading.skipped["graphs: Rankboard stores scalars"] += 1
            continue
        for value in event.summary.value:
            kind = _kind(value, plugins)
            if kind == "scalars":
                yield _key(prefix, value.tag), event.step, _scalar(value), event.wall_time
            elif kind == hparams_metadata.PLUGIN_NAME:
                prefix = ""  # add_hparams' own folder: its metrics are the run's, by their tags alone
            else:
                reading.skipped[f"{_SKIPPED.get(kind, kind or 'tensors')}: Rankboard stores scalars"] += 1


def _kind(value: summary_pb2.Summary.Value, plugins: dict[str, str]) -> str:
    """What a summary value is: "scalars", a plugin's name, or the field it fills (histo, image, audio)."""
    field = value.WhichOneof("value")
    if field == "simple_value":
        return "scalars"
    plugin = value.metadata.plugin_data.plugin_name or plugins.get(value.tag, "")
    plugins[value.tag] = plugin
    if plugin or field != "tensor":
        return plugin or field or ""
    # A rank-0 number without a plugin: tf.summary.scalar from before the scalars plugin named itself.
    return "scalars" if not value.tensor.tensor_shape.dim and _is_number(value.tensor) else ""


def _is_number(tensor: Any) -> bool:
    return bool(tensor.float_val or tensor.double_val or tensor.int_val or tensor.int64_val or tensor.tensor_content)


def _scalar(value: summary_pb2.Summary.Value) -> float:
    if value.WhichOneof("value") == "simple_value":
        return float(value.simple_value)
    tensor = value.tensor
    if tensor.float_val:  # what PyTorch and tf.summary.scalar write: read it without building an array
        return float(tensor.float_val[0])
    if tensor.double_val:
        return float(tensor.double_val[0])
    return float(tensor_util.make_ndarray(tensor).item())


def _hyperparameters(path: Path) -> dict[str, Any]:
    """The HParams plugin's session start (add_hparams, hp.hparams), where a writer puts it: among the file's
    first events."""
    for count, record in enumerate(_records(path, Reading())):
        if count >= _PEEK_EVENTS:
            break
        for value in event_pb2.Event.FromString(record).summary.value:
            if value.tag == hparams_metadata.SESSION_START_INFO_TAG:
                content = value.metadata.plugin_data.content
                start = hparams_metadata.parse_session_start_info_plugin_data(content)
                return {name: _protobuf_value(item) for name, item in start.hparams.items()}
    return {}


def _protobuf_value(value: Any) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() and abs(number) < 2**53 else number
    return getattr(value, kind) if kind in ("string_value", "bool_value") else None


def _records(path: Path, reading: Reading) -> Iterator[bytes]:
    """Each TFRecord's data, read in large chunks. The CRCs are not checked: TensorBoard's own reader (without
    TensorFlow) computes CRC32C in pure Python, which costs most of its time (bench/import_tensorboard.py); a record
    cut short (a writer still at work, or killed) ends the file, counted skipped."""
    with path.open("rb") as file:
        buffer, position = b"", 0
        while True:
            if len(buffer) - position < _HEADER.size:
                buffer, position = buffer[position:] + file.read(_CHUNK), 0
                if len(buffer) < _HEADER.size:
                    break
            length = _HEADER.unpack_from(buffer, position)[0]
            end = position + _HEADER.size + length + 4
            if end > len(buffer):
                buffer, position = buffer[position:] + file.read(max(_CHUNK, end - position)), 0
                if position + _HEADER.size + length + 4 > len(buffer):
                    break
                end = _HEADER.size + length + 4
            yield buffer[position + _HEADER.size : end - 4]
            reading.done += end - position
            position = end
    if buffer[position:]:
        reading.skipped["a last record cut short (its writer still at work, or killed)"] += 1
