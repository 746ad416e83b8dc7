"""GPU and system samples coded as samples: a chunk of short decimals as whole numbers and differences

Revision ID: 0021_sample_chunks
Revises: 0020_queue

Each chunk of a `gpu/...` or `sys/...` series whose values are all decimals of up to MAX_DECIMALS digits is written
again in the samples' format (app.store.chunks: SAMPLES), series by series, CHUNKS at a time by key, in the
migration's one transaction (memory stays bounded by CHUNKS, and a migration cut short leaves the store as it was).
Other chunks keep their bytes: ingest writes a chunk in the samples' format whenever it rewrites one whose values
allow it. Downgrade writes every chunk in the samples' format, of any series, back as shuffled floats.

The formats are written here as they are at this revision, not read from the app, so that this migration does the
same whenever it runs.
"""

import struct
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

revision: str = "0021_sample_chunks"
down_revision: str | None = "0020_queue"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHUNKS = 2000  # about 128,000 points
SAMPLES = 0x01  # a blob's first byte in the samples' format; shuffled floats start with zlib's header, 0x78
MAX_DECIMALS = 3
UPDATE = sa.text("UPDATE metric_chunks SET data = :data WHERE series_id = :s AND chunk = :c AND rank = :r")


def pages(where: str, params: dict[str, Any]) -> Iterator[Sequence[sa.Row[Any]]]:
    """The chunks that `where` picks, CHUNKS at a time by key."""
    page = sa.text(
        f"SELECT series_id, chunk, rank, n, data FROM metric_chunks WHERE {where}"
        " AND (series_id, chunk, rank) > (:s, :c, :r) ORDER BY series_id, chunk, rank LIMIT :n"
    )
    after = {"s": -1, "c": -1, "r": -1}
    while rows := op.get_bind().execute(page, {**params, **after, "n": CHUNKS}).all():
        yield rows
        after = {"s": rows[-1].series_id, "c": rows[-1].chunk, "r": rows[-1].rank}


def shuffled_floats(data: bytes, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps, values and times of a chunk of three byte-shuffled float64 columns (step deltas, values, times)."""
    columns = np.frombuffer(zlib.decompress(data), dtype=np.uint8).reshape(3, 8, n).transpose(0, 2, 1).copy()
    columns = columns.view("<u8").reshape(3, n)
    return np.cumsum(columns[0].view("<i8")), columns[1].view("<f8"), columns[2].view("<f8")


def as_shuffled_floats(steps: np.ndarray, values: np.ndarray, times: np.ndarray) -> bytes:
    columns = np.empty((3, len(steps)), dtype="<f8")
    columns[0].view("<i8")[:] = np.diff(steps, prepend=0)
    columns[1], columns[2] = values, times
    return zlib.compress(columns.view(np.uint8).reshape(3, len(steps), 8).transpose(0, 2, 1).tobytes(), 1)


def decimals(values: np.ndarray) -> tuple[int, np.ndarray] | None:
    """The fewest decimal digits that write every value exactly, and the values as whole numbers of them."""
    for digits in range(MAX_DECIMALS + 1):
        whole = np.rint(values * 10.0**digits)
        if not np.abs(whole).max() <= 2**53:
            return None  # NaN or an infinity: never a decimal
        numbers = whole.astype("<i8")
        if ((numbers / 10.0**digits).view("<i8") == values.view("<i8")).all():  # -0.0 is not 0 here
            return digits, numbers
    return None


def float_bits(step: int) -> int:
    return int(struct.unpack("<q", struct.pack("<d", float(step)))[0])


def wrapped(number: int) -> int:
    return (number + 2**63) % 2**64 - 2**63


def as_samples(steps: np.ndarray, times: np.ndarray, digits: int, numbers: np.ndarray) -> bytes:
    """The samples' format: the first step, the first time's bits less the first step's as a float, the first whole
    value, each column's least difference, then the differences less it, byte-shuffled; raw deflate."""
    columns = np.stack([steps.astype("<i8"), times.view("<i8"), numbers])
    changes = np.diff(columns, axis=1)
    least = changes.min(axis=1) if changes.shape[1] else np.zeros(3, "<i8")
    changes -= least[:, None]
    head = struct.pack("<6q", int(steps[0]), wrapped(int(columns[1, 0]) - float_bits(int(steps[0]))),
                       int(numbers[0]), *least.tolist())  # fmt: skip
    body = changes.view(np.uint8).reshape(3, -1, 8).transpose(0, 2, 1).tobytes()
    return bytes((SAMPLES, digits)) + zlib.compress(head + body, 1, wbits=-15)


def samples(blob: bytes, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps, values and times of a chunk in the samples' format."""
    data = zlib.decompress(blob[2:], wbits=-15)
    first_step, offset, first_number, *least = struct.unpack_from("<6q", data)
    changes = np.frombuffer(data, np.uint8, offset=48).reshape(3, 8, n - 1).transpose(0, 2, 1).copy().view("<i8")
    columns = np.empty((3, n), "<i8")
    columns[:, 0] = first_step, wrapped(float_bits(first_step) + offset), first_number
    columns[:, 1:] = changes.reshape(3, n - 1) + np.array(least, "<i8")[:, None]
    np.cumsum(columns, axis=1, out=columns)
    return columns[0], columns[2] / 10.0 ** blob[1], columns[1].view("<f8")


def upgrade() -> None:
    series = op.get_bind().execute(
        sa.text("SELECT id FROM metric_series WHERE key LIKE 'gpu/%' OR key LIKE 'sys/%' ORDER BY id")
    )
    for (series_id,) in series.all():
        for rows in pages("series_id = :series_id", {"series_id": series_id}):
            changed = []
            for row in rows:
                if row.data[0] == SAMPLES:
                    continue
                steps, values, times = shuffled_floats(row.data, row.n)
                if (found := decimals(values)) is not None:
                    data = as_samples(steps, times, *found)
                    changed.append({"data": data, "s": row.series_id, "c": row.chunk, "r": row.rank})
            if changed:
                op.get_bind().execute(UPDATE, changed)


def downgrade() -> None:
    for rows in pages("substr(data, 1, 1) = :samples", {"samples": bytes((SAMPLES,))}):
        back = [{"data": as_shuffled_floats(*samples(row.data, row.n)), "s": row.series_id, "c": row.chunk,
                 "r": row.rank} for row in rows]  # fmt: skip
        op.get_bind().execute(UPDATE, back)
