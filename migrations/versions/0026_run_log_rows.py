"""the live pages' log: one row per run per ingest transaction, not one per (series, rank)

Revision ID: 0026_run_log_rows
Revises: 0025_login_failures

A GPU node's post adds a point or two to each of ~90 (series, rank), and logging each as a row of its own was a sixth
of the ingest writer's time. A row now holds a run's points of one transaction, each (series, rank)
named in its blob's head (app.store.metrics.log_recent), and is found by its run, not its series. The rows are moved,
both ways, keeping every point's number: a page open across the upgrade goes on from its cursor. Each old row
becomes a row of one column; going back, each column becomes an old row, numbered by its last point.
"""

import struct
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from app.store import chunks

revision: str = "0026_run_log_rows"
down_revision: str | None = "0025_login_failures"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
LOGGED = 0x04  # app.store.metrics' log row
COLUMN = struct.Struct("<qii")  # series_id, rank, n
PAGE = 2000


def upgrade() -> None:
    _moved(
        lambda: _create("run_id", "runs.id"),
        "SELECT r.id, s.run_id, r.series_id, r.rank, r.n, r.data FROM metric_recent_old r"
        " JOIN metric_series s ON s.id = r.series_id WHERE r.id > :after ORDER BY r.id",
        _by_run,
    )


def downgrade() -> None:
    _moved(
        lambda: _create("series_id", "metric_series.id", sa.Column("rank", sa.Integer(), nullable=False)),
        "SELECT id, run_id, n, data FROM metric_recent_old WHERE id > :after ORDER BY id",
        _by_series,
    )


Rows = list[dict[str, Any]]


def _moved(create: Callable[[], sa.Table], query: str, rows_of: Callable[[sa.Row[Any]], Rows]) -> None:
    """The log renamed, made again by `create`, and its rows moved over, PAGE at a time, each as `rows_of` makes it."""
    op.rename_table("metric_recent", "metric_recent_old")
    for index in sa.inspect(op.get_bind()).get_indexes("metric_recent_old"):
        op.drop_index(index["name"], table_name="metric_recent_old")
    if op.get_bind().dialect.name == "postgresql":  # the new table's key takes the old one's name
        op.execute("ALTER INDEX metric_recent_pkey RENAME TO metric_recent_old_pkey")
    table = create()
    after = -1
    while found := op.get_bind().execute(sa.text(f"{query} LIMIT {PAGE}"), {"after": after}).all():
        op.bulk_insert(table, [row for old in found for row in rows_of(old)])
        after = found[-1].id
    op.drop_table("metric_recent_old")


def _create(owner: str, refers: str, *more: sa.Column[Any]) -> sa.Table:
    """The log's table, its rows found by `owner` (referring to `refers`), with the `more` columns after it."""
    table = op.create_table(
        "metric_recent",
        sa.Column("id", ID_TYPE, autoincrement=False, nullable=False),
        sa.Column(owner, sa.Integer(), nullable=False),
        *more,
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint([owner], [refers], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(f"ix_metric_recent_{owner}_id", "metric_recent", [owner, "id"])
    return table


def _by_run(old: sa.Row[Any]) -> Rows:
    """An old row as a log row of one column (its points as raw records: a row of a server before 0024, or written
    going back to it, has them packed)."""
    head = struct.pack("<BI", LOGGED, 1) + COLUMN.pack(old.series_id, old.rank, old.n)
    records = chunks.records(*chunks.decode(bytes(old.data), old.n).columns())
    return [{"id": old.id, "run_id": old.run_id, "n": old.n, "data": head + records}]


def _by_series(old: sa.Row[Any]) -> Rows:
    """A log row's columns as old rows, each numbered by its last point."""
    data = bytes(old.data)
    (count,) = struct.unpack_from("<I", data, 1)
    start, last_id, rows = 5 + count * COLUMN.size, old.id - old.n, Rows()
    for series_id, rank, n in COLUMN.iter_unpack(data[5 : 5 + count * COLUMN.size]):
        last_id, end = last_id + n, start + n * chunks.RECORD.size
        rows.append({"id": last_id, "series_id": series_id, "rank": rank, "n": n,
                     "data": bytes((chunks.RECORDS,)) + data[start:end]})  # fmt: skip
        start = end
    return rows
