"""chunks with points appended raw, and the live pages' log as raw records

Revision ID: 0024_chunk_tails
Revises: 0023_run_costs

Ingest appends a post's points after a chunk's packed ones as raw records (app.store.chunks: TAILED) instead of
unpacking and packing the chunk again, and logs new points for live pages as raw records (RECORDS). No table
changes: upgrading marks the store as holding blobs a server before this revision cannot read, which then refuses
the store instead of failing on its first chart. Downgrade packs each such chunk whole (samples where its values
allow, else shuffled floats: both read at 0023), and each chunk of records alone (ingest starts a chunk so since
issue 39; a server of 0024 on reads it as any other), and writes the log's records as shuffled floats, through the
code that ingest uses (as 0015 does), PAGE rows at a time in its one transaction.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store import chunks

revision: str = "0024_chunk_tails"
down_revision: str | None = "0023_run_costs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PAGE = 2000


def upgrade() -> None:
    pass


def downgrade() -> None:
    _rewrite("metric_chunks", ("series_id", "chunk", "rank"), chunks.TAILED, samples=True)
    _rewrite("metric_chunks", ("series_id", "chunk", "rank"), chunks.RECORDS, samples=True)
    _rewrite("metric_recent", ("id",), chunks.RECORDS, samples=False)


def _rewrite(table: str, key: Sequence[str], kind: int, *, samples: bool) -> None:
    """Each row of `table` whose blob is of `kind`, packed whole, PAGE rows at a time by `key`."""
    columns = ", ".join(key)
    marks, after = ", ".join(f":{name}" for name in key), " AND ".join(f"{name} = :{name}" for name in key)
    page = sa.text(
        f"SELECT {columns}, n, data FROM {table} WHERE substr(data, 1, 1) = :kind AND ({columns}) > ({marks})"
        f" ORDER BY {columns} LIMIT {PAGE}"
    )
    update = sa.text(f"UPDATE {table} SET data = :data WHERE {after}")
    bound = dict.fromkeys(key, -1)
    while rows := op.get_bind().execute(page, {"kind": bytes((kind,)), **bound}).all():
        packed = []
        for row in rows:
            points = chunks.decode(bytes(row.data), row.n)
            packed.append({**row._mapping, "data": chunks.encode(*points.columns(), samples=samples)})
        op.get_bind().execute(update, packed)
        bound = {name: getattr(rows[-1], name) for name in key}
