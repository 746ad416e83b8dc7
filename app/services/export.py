"""Export runs as files: their points (run, key, rank, step, time, value) and the runs themselves with their config,
as Parquet or CSV, one table a file, or both in a zip; app/schemas/export.py says what each column holds.

Everything streams in bounded memory, whatever the number of points: each series is read from the store EXPORT_STEPS
steps at a time, each read in a session of its own (no transaction stays open while a client downloads), and each
read becomes one Arrow record batch, written at once (one Parquet row group, or its CSV lines) into a sink whose
bytes are handed on as soon as they are written (bench/export.py: 10 M points).
"""

from __future__ import annotations

import io
import json
import time
import zipfile
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as arrow_csv
import pyarrow.parquet as parquet
from sqlalchemy.orm import Session, sessionmaker

from app.core.models import Run
from app.schemas.export import ExportFormat, ExportTable
from app.services import runs
from app.store import chunks
from app.store import metrics as metric_store

EXPORT_STEPS = 1024 * chunks.SPAN  # steps of one series per read: a record batch of ~65 k points a rank
POINTS = pa.schema([("run", pa.int64()), ("key", pa.dictionary(pa.int32(), pa.string())), ("rank", pa.int64()),
                    ("step", pa.int64()), ("time", pa.float64()), ("value", pa.float64())])  # fmt: skip
_WHEN = pa.timestamp("us", tz="UTC")
RUNS = pa.schema([
    ("run", pa.int64()), ("name", pa.string()), ("status", pa.string()), ("launcher", pa.string()),
    ("created_at", _WHEN), ("started_at", _WHEN), ("finished_at", _WHEN), ("step", pa.int64()),
    ("total_steps", pa.int64()), ("final_loss", pa.float64()), ("world_size", pa.int64()),
    ("external_key", pa.string()), ("tags", pa.string()), ("notes", pa.string()), ("config", pa.string()),
])  # fmt: skip


def checked(db: Session, *, run_ids: Sequence[int]) -> list[int]:
    """The run ids, each once, in the order asked; raises RunNotFound before anything streams."""
    unique = list(dict.fromkeys(run_ids))
    for run_id in unique:
        runs.get_run(db, run_id=run_id)
    return unique


def table(sessions: sessionmaker[Session], *, run_ids: Sequence[int], name: ExportTable,
          form: ExportFormat) -> Iterator[bytes]:  # fmt: skip
    """One table of the runs (already checked), as a file's bytes."""
    if name == "runs":
        return _written(iter([_runs_batch(sessions, run_ids)]), RUNS, form)
    return _written(point_batches(sessions, run_ids=run_ids), POINTS, form)


def archive(sessions: sessionmaker[Session], *, run_ids: Sequence[int], form: ExportFormat) -> Iterator[bytes]:
    """Both tables in a zip, `points.<form>` and `runs.<form>`, streamed (a zip that needs no seeking back)."""
    sink = _Pending()
    compression = zipfile.ZIP_STORED if form == "parquet" else zipfile.ZIP_DEFLATED  # Parquet is compressed already
    with zipfile.ZipFile(sink, "w", compression=compression, compresslevel=1) as bundle:
        for name, batches, schema in (("runs", iter([_runs_batch(sessions, run_ids)]), RUNS),
                                      ("points", point_batches(sessions, run_ids=run_ids), POINTS)):  # fmt: skip
            entry_info = zipfile.ZipInfo(f"{name}.{form}", date_time=time.localtime()[:6])
            entry_info.compress_type = compression
            with bundle.open(entry_info, "w", force_zip64=True) as entry:
                for _ in _write(batches, schema, form, entry):
                    yield sink.take()
    yield sink.take()


def point_batches(sessions: sessionmaker[Session], *, run_ids: Sequence[int]) -> Iterator[pa.RecordBatch]:
    """Every stored point of the runs, by run, key (as the store lists them), step and rank: a batch per read."""
    for run_id in run_ids:
        with sessions() as db:
            series = [(key, metric_store.find_series(db, run_id=run_id, key=key))
                      for key in metric_store.series_keys(db, run_id=run_id)]  # fmt: skip
        for key, series_id in series:
            if series_id is not None:
                yield from _series_batches(sessions, run_id=run_id, key=key, series_id=series_id)


def _series_batches(sessions: sessionmaker[Session], *, run_id: int, key: str,
                    series_id: int) -> Iterator[pa.RecordBatch]:  # fmt: skip
    step = 0
    keys = pa.array([key])
    while True:
        with sessions() as db:
            first = chunks.read_on_from(db, series_id=series_id, step=step)  # a gap of a million steps is one seek
            if first is None:
                return
            points = chunks.read(db, series_id=series_id, first=first, last=first + EXPORT_STEPS - 1)
        count = len(points.steps)
        if count:
            key_column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, dtype=np.int32)), keys)
            yield pa.record_batch([pa.array(np.full(count, run_id, dtype=np.int64)), key_column,
                                   pa.array(points.ranks, pa.int64()), pa.array(points.steps, pa.int64()),
                                   pa.array(points.times, pa.float64()), pa.array(points.values, pa.float64())],
                                  schema=POINTS)  # fmt: skip
        step = first + EXPORT_STEPS


def _runs_batch(sessions: sessionmaker[Session], run_ids: Sequence[int]) -> pa.RecordBatch:
    """One row per run, in the order asked (a few thousand runs at most: one batch)."""
    with sessions() as db:
        rows = [_run_row(runs.get_run(db, run_id=run_id)) for run_id in run_ids]
    return pa.RecordBatch.from_pylist(rows, schema=RUNS)


def _run_row(run: Run) -> dict[str, Any]:
    return {
        "run": run.id, "name": run.name, "status": run.status.value, "launcher": run.launcher,
        "created_at": run.created_at, "started_at": run.started_at, "finished_at": run.finished_at,
        "step": run.step, "total_steps": run.total_steps, "final_loss": run.final_loss, "world_size": run.world_size,
        "external_key": run.external_key, "tags": json.dumps(list(run.tags)), "notes": run.notes,
        "config": json.dumps(run.config or {}, default=str),
    }  # fmt: skip


def _written(batches: Iterator[pa.RecordBatch], schema: pa.Schema, form: ExportFormat) -> Iterator[bytes]:
    sink = _Pending()
    for _ in _write(batches, schema, form, sink):
        yield sink.take()
    yield sink.take()


def _write(batches: Iterator[pa.RecordBatch], schema: pa.Schema, form: ExportFormat, sink: Any) -> Iterator[None]:
    """Write the batches into `sink` as Parquet or CSV, pausing after each so that its bytes can be taken."""
    writer: Any = parquet.ParquetWriter(sink, schema) if form == "parquet" else arrow_csv.CSVWriter(sink, schema)
    try:
        for batch in batches:
            writer.write_batch(batch)
            yield
    finally:
        writer.close()


class _Pending(io.RawIOBase):
    """A write-only stream that holds what was written until it is taken: the bytes a writer (Parquet's, CSV's,
    a zip's) produced since the last take, so that a response can send them on."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        self._position += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        return self._position

    def take(self) -> bytes:
        taken, self._parts = b"".join(self._parts), []
        return taken
