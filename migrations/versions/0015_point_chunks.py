"""metric points packed into chunks (a quarter of the bytes), a log of new points for live pages, and each tier
bucket's last value

Revision ID: 0015_point_chunks
Revises: 0013_goodput

The points are moved series by series, PAGE at a time, through the same code that ingest uses (app.store.chunks
and the tiers' refresh), so a moved store is what ingest would have built; a chunk is read back and merged with the
next page's points where a page ends inside it. All of it is one transaction: memory stays bounded by PAGE, and a
migration cut short leaves the store as it was. SQLite keeps the file's size until a VACUUM hands the freed pages
back (`sqlite3 rankboard.db VACUUM`, with the server stopped).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

from app.store import charts, chunks, summaries

revision: str = "0015_point_chunks"
down_revision: str | None = "0013_goodput"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PAGE = 100_000
ID_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
STEP_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "metric_chunks",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("chunk", STEP_TYPE, nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("first_time", sa.Float(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["series_id"], ["metric_series.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("series_id", "chunk", "rank"),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "metric_recent",
        sa.Column("id", ID_TYPE, autoincrement=False, nullable=False),
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["series_id"], ["metric_series.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_metric_recent_series_id_id", "metric_recent", ["series_id", "id"])
    op.add_column("metric_tiers", sa.Column("last_value", sa.Float(), nullable=True))
    db = Session(bind=op.get_bind())
    for series_id in db.scalars(sa.text("SELECT id FROM metric_series ORDER BY id")).all():
        _move_series(db, series_id)
    # The log numbers points on from the newest point's id: a page open across the upgrade reconnects with that
    # cursor, and a log counting from 0 would send it nothing until the count caught up. A row of no points says so.
    newest = db.execute(sa.text("SELECT id, series_id FROM metric_points ORDER BY id DESC LIMIT 1")).first()
    if newest is not None:
        none = chunks.Points.empty()
        empty = chunks.encode(none.steps, none.values, none.times)
        db.execute(
            sa.text("INSERT INTO metric_recent (id, series_id, rank, n, data) VALUES (:id, :series_id, 0, 0, :data)"),
            {"id": newest[0], "series_id": newest[1], "data": empty},
        )
    op.drop_table("metric_points")


def _move_series(db: Session, series_id: int) -> None:
    """The series' points into chunks, PAGE at a time by (step, rank), and its tiers and summary rebuilt from them."""
    page = sa.text(
        "SELECT step, rank, value, time FROM metric_points"
        " WHERE series_id = :series_id AND (step, rank) > (:step, :rank) ORDER BY step, rank LIMIT :n"
    )
    after = (-1, -1)
    while rows := db.execute(page, {"series_id": series_id, "step": after[0], "rank": after[1], "n": PAGE}).all():
        by_rank: dict[int, tuple[list[int], list[float], list[float]]] = {}
        for step, rank, value, time in rows:
            steps, values, times = by_rank.setdefault(rank, ([], [], []))
            steps.append(step)
            values.append(float("nan") if value is None else value)  # the point table kept NaN as NULL
            times.append(time)
        columns = {(series_id, rank): chunks.Column.of(*points) for rank, points in by_rank.items()}
        charts.refresh_tiers(db, chunks.write(db, columns), times=False)  # the tiers' times came with 0018
        after = (rows[-1][0], rows[-1][1])
    summaries.refresh(db, [series_id])  # as ingest would have left it: its last value now comes from the tiers


def downgrade() -> None:
    op.create_table(
        "metric_points",
        sa.Column("id", ID_TYPE, nullable=False),
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("step", STEP_TYPE, nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["series_id"], ["metric_series.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("series_id", "step", "rank"),
    )
    op.create_index("ix_metric_points_series_id_id", "metric_points", ["series_id", "id"])
    db = Session(bind=op.get_bind())
    rows = db.execute(sa.text("SELECT series_id, rank, n, data FROM metric_chunks ORDER BY series_id, chunk, rank"))
    insert = sa.text(
        "INSERT INTO metric_points (series_id, step, rank, value, time)"
        " VALUES (:series_id, :step, :rank, :value, :time)"
    )
    for series_id, rank, n, data in rows.yield_per(1000):
        column = chunks.decode(data, n)
        points = zip(column.steps.tolist(), column.values.tolist(), column.times.tolist(), strict=True)
        db.execute(insert, [{"series_id": series_id, "step": step, "rank": rank,
                             "value": None if value != value else value, "time": time}
                            for step, value, time in points])  # fmt: skip
    op.drop_column("metric_tiers", "last_value")
    op.drop_index("ix_metric_recent_series_id_id", table_name="metric_recent")
    op.drop_table("metric_recent")
    op.drop_table("metric_chunks")
