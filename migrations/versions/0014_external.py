"""external runs: a job started elsewhere (its own sbatch, torchrun or Kubernetes) that reports into one run

Revision ID: 0014
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("external_key", sa.String(200), nullable=True))
        batch.add_column(sa.Column("config", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("world_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("contact_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("takes_stop", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("checkpoint_folder", sa.String(1000), nullable=True))
        batch.create_unique_constraint("uq_runs_external_key", ["external_key"])
    with op.batch_alter_table("run_ranks") as batch:
        batch.add_column(sa.Column("ended", sa.String(16), nullable=True))
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
    with op.batch_alter_table("run_ranks") as batch:
        batch.drop_column("ended")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("uq_runs_external_key", type_="unique")
        for column in ("checkpoint_folder", "takes_stop", "contact_at", "world_size", "config", "external_key"):
            batch.drop_column(column)
