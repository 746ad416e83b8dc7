"""external runs: a job started elsewhere (its own sbatch, torchrun or Kubernetes) that reports into one run

Revision ID: 0014
Revises: 0011_runs_table

Columns are added, never by rebuilding `runs` (Alembic's batch mode on SQLite): dropping the old table would cascade
to every run's series and points through their foreign keys.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0011_runs_table"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    sa.Column("external_key", sa.String(200), nullable=True),
    sa.Column("config", sa.JSON(), nullable=True),
    sa.Column("world_size", sa.Integer(), nullable=True),
    sa.Column("contact_at", sa.DateTime(), nullable=True),
    sa.Column("takes_stop", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("checkpoint_folder", sa.String(1000), nullable=True),
)


def upgrade() -> None:
    for column in COLUMNS:
        op.add_column("runs", column)
    op.create_index("ix_runs_external_key", "runs", ["external_key"], unique=True)
    op.add_column("run_ranks", sa.Column("ended", sa.String(16), nullable=True))
    op.create_table(
        "run_tokens",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_run_tokens_run_id", "run_tokens", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_run_tokens_run_id", table_name="run_tokens")
    op.drop_table("run_tokens")
    op.drop_column("run_ranks", "ended")
    op.drop_index("ix_runs_external_key", table_name="runs")
    for column in reversed(COLUMNS):
        op.drop_column("runs", column.name)
