"""each tier bucket's time: the unix time of its last point, so that a chart's x axis can be wall time

Revision ID: 0018_tier_times
Revises: 0017_run_config

`metric_tiers.last_time` is the time of the point at the bucket's `last_step`. A store's tiers get theirs from the
chunks, CHUNKS at a time by key, in the migration's one transaction (memory stays bounded by CHUNKS, and a migration
cut short leaves the store as it was): the finest tier's from the points themselves (a finest bucket lies in one
chunk), then each coarser tier's, in one statement, from the finer row that holds its last step, as ingest does.
Downgrade drops the column in place (SQLite 3.35 and later).

The chunks' format and the tier sizes are written here as they are at this revision, not read from the app, so that
this migration does the same whenever it runs.
"""

import itertools
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

revision: str = "0018_tier_times"
down_revision: str | None = "0017_run_config"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHUNKS = 2000  # about 128,000 points
TIERS = (16, 256, 4096, 65536)
# Each coarser tier's time from the finer bucket holding its last step; the tier sizes are literals (see above).
FROM_FINER = (
    "UPDATE metric_tiers SET last_time = (SELECT f.last_time FROM metric_tiers f WHERE f.series_id ="
    " metric_tiers.series_id AND f.tier = {finer} AND f.bucket = metric_tiers.last_step / {finer}"
    " AND f.rank = metric_tiers.rank) WHERE tier = {tier}"
)


def chunk_pages() -> Iterator[Sequence[sa.Row[Any]]]:
    """Every chunk, CHUNKS at a time, by key."""
    page = sa.text(
        "SELECT series_id, chunk, rank, n, data FROM metric_chunks WHERE (series_id, chunk, rank) > (:s, :c, :r)"
        " ORDER BY series_id, chunk, rank LIMIT :n"
    )
    after = {"s": -1, "c": -1, "r": -1}
    while rows := op.get_bind().execute(page, {**after, "n": CHUNKS}).all():
        yield rows
        after = {"s": rows[-1].series_id, "c": rows[-1].chunk, "r": rows[-1].rank}


def steps_and_times(data: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A chunk's steps and times: three byte-shuffled float64 columns (step deltas, values, times), zlib'd."""
    columns = np.frombuffer(zlib.decompress(data), dtype=np.uint8).reshape(3, 8, n).transpose(0, 2, 1).copy()
    columns = columns.view("<u8").reshape(3, n)
    return np.cumsum(columns[0].view("<i8")), columns[2].view("<f8")


def finest_times(rows: Sequence[sa.Row[Any]]) -> list[dict[str, Any]]:
    """The time of each finest bucket's last point, for each chunk."""
    found = []
    for row in rows:
        steps, times = steps_and_times(row.data, row.n)
        bucket = steps // TIERS[0]
        ends = np.r_[np.flatnonzero(np.diff(bucket)), len(steps) - 1]
        found += [{"s": row.series_id, "b": b, "r": row.rank, "t": t}
                  for b, t in zip(bucket[ends].tolist(), times[ends].tolist(), strict=True)]  # fmt: skip
    return found


def upgrade() -> None:
    op.add_column("metric_tiers", sa.Column("last_time", sa.Float(), nullable=True))
    write = sa.text(
        f"UPDATE metric_tiers SET last_time = :t WHERE series_id = :s AND tier = {TIERS[0]} AND bucket = :b"
        " AND rank = :r"
    )
    for rows in chunk_pages():
        op.get_bind().execute(write, finest_times(rows))
    for finer, tier in itertools.pairwise(TIERS):
        op.execute(FROM_FINER.format(finer=finer, tier=tier))


def downgrade() -> None:
    op.drop_column("metric_tiers", "last_time")
