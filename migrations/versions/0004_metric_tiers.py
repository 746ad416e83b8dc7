"""metric tiers: series pre-aggregated per 16, 256, 4,096 and 65,536 steps, for charts

Revision ID: 0004
Revises: 0003
"""

import itertools
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here: app.store.charts.TIERS may grow, but this migration must always build what it built.
TIERS = (16, 256, 4096, 65536)


def upgrade() -> None:
    op.create_table(
        "metric_tiers",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("tier", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("min_value", sa.Float(), nullable=True),
        sa.Column("max_value", sa.Float(), nullable=True),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["series_id"], ["metric_series.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("series_id", "tier", "bucket", "rank"),
        sqlite_with_rowid=False,
    )
    # The points stored before this version get their tiers too, or their charts would be empty when zoomed out.
    op.execute(
        "INSERT INTO metric_tiers (series_id, tier, bucket, rank, min_value, max_value, last_step)"
        f" SELECT series_id, {TIERS[0]}, step / {TIERS[0]}, rank, MIN(value), MAX(value), MAX(step)"
        f" FROM metric_points GROUP BY series_id, step / {TIERS[0]}, rank"
    )
    for finer, tier in itertools.pairwise(TIERS):
        op.execute(
            "INSERT INTO metric_tiers (series_id, tier, bucket, rank, min_value, max_value, last_step)"
            f" SELECT series_id, {tier}, bucket / {tier // finer}, rank, MIN(min_value), MAX(max_value),"
            f" MAX(last_step) FROM metric_tiers WHERE tier = {finer}"
            f" GROUP BY series_id, bucket / {tier // finer}, rank"
        )


def downgrade() -> None:
    op.drop_table("metric_tiers")
