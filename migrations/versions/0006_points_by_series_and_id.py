"""an index on metric points by (series, id), for the live pages' "points since the last one I got"

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_metric_points_series_id_id", "metric_points", ["series_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_metric_points_series_id_id", table_name="metric_points")
