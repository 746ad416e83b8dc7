"""a run's preflight mode (before the first step the ranks compare their software and time an all-reduce; "refuse"
stops the run when a rank differs), and the run a scaling sweep's run belongs to

Revision ID: 0013_goodput
Revises: 0012_forensics
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_goodput"
down_revision: str | None = "0012_forensics"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN: a batch copy of `runs` on SQLite would cascade into every run's metrics (see 0006).
    op.add_column("runs", sa.Column("preflight", sa.String(8), nullable=False, server_default="warn"))
    # The run a scaling sweep was started from; no foreign key: a sweep's runs outlive a deleted origin.
    op.add_column("runs", sa.Column("sweep_of", sa.Integer(), nullable=True))
    op.create_index("ix_runs_sweep_of", "runs", ["sweep_of"])


def downgrade() -> None:
    op.drop_index("ix_runs_sweep_of", table_name="runs")
    op.drop_column("runs", "sweep_of")
    op.drop_column("runs", "preflight")
