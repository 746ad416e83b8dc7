"""runs table: tags, notes, archive and deletion marks on runs; a per-series summary (last, min, max) for the table

Revision ID: 0011_runs_table
Revises: 0010

The summary of each series is backfilled here from the coarsest chart tier (whose buckets hold every point of the
series), and kept up to date on ingest from then on (app.store.summaries).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_runs_table"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COARSEST_TIER = 65536  # app.store.charts.TIERS[-1], as of this migration


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("notes", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("archived_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("deleting_at", sa.DateTime(), nullable=True))
    op.create_table(
        "run_tags",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("tag", sa.String(64), primary_key=True),
    )
    op.create_index("ix_run_tags_tag", "run_tags", ["tag"])
    op.create_table(
        "metric_summaries",
        sa.Column(
            "series_id",
            sa.Integer(),
            sa.ForeignKey("metric_series.id", ondelete="CASCADE"),
            primary_key=True,
            autoincrement=False,
        ),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("last_step", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("last_value", sa.Float(), nullable=True),
        sa.Column("min_value", sa.Float(), nullable=True),
        sa.Column("max_value", sa.Float(), nullable=True),
    )
    op.create_index("ix_metric_summaries_key_run", "metric_summaries", ["key", "run_id"], unique=True)
    op.create_index("ix_metric_summaries_run_id", "metric_summaries", ["run_id"])
    op.execute(
        "INSERT INTO metric_summaries (series_id, run_id, key, last_step, min_value, max_value)"
        " SELECT s.id, s.run_id, s.key, MAX(t.last_step), MIN(t.min_value), MAX(t.max_value)"
        f" FROM metric_series s JOIN metric_tiers t ON t.series_id = s.id AND t.tier = {COARSEST_TIER}"
        " GROUP BY s.id, s.run_id, s.key"
    )
    op.execute(
        "UPDATE metric_summaries SET last_value = (SELECT p.value FROM metric_points p"
        " WHERE p.series_id = metric_summaries.series_id AND p.step = metric_summaries.last_step"
        " ORDER BY p.rank LIMIT 1)"
    )


def downgrade() -> None:
    op.drop_table("metric_summaries")
    op.drop_table("run_tags")
    # Not batch mode: on SQLite it copies `runs` and drops the original, and with foreign keys on that drop would
    # cascade to every run's series and points. SQLite has had ALTER TABLE DROP COLUMN since 3.35.
    for column in ("deleting_at", "archived_at", "notes"):
        op.drop_column("runs", column)
