"""a run's attempt: a Slurm job requeued after the time-limit warning is the same run's next attempt

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN: a batch copy of `runs` on SQLite would cascade into every run's metrics (see 0006).
    op.add_column("runs", sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("runs", "attempt")
