"""a run's preflight mode: before the first step the ranks compare their software and time an all-reduce; "refuse"
stops the run when a rank differs

Revision ID: 0013_goodput
Revises: 0010_alerts
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_goodput"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN: a batch copy of `runs` on SQLite would cascade into every run's metrics (see 0006).
    op.add_column("runs", sa.Column("preflight", sa.String(8), nullable=False, server_default="warn"))


def downgrade() -> None:
    op.drop_column("runs", "preflight")
