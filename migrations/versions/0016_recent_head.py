"""the live log's newest point number, kept apart from its rows, so that deleting a run never makes a number again

Revision ID: 0016_recent_head
Revises: 0015_point_chunks
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_recent_head"
down_revision: str | None = "0015_point_chunks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "metric_recent_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("head", ID_TYPE, nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.execute("INSERT INTO metric_recent_head (id, head) SELECT 1, COALESCE(MAX(id), 0) FROM metric_recent")


def downgrade() -> None:
    op.drop_table("metric_recent_head")
