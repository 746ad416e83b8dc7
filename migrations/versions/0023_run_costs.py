"""run costs: what each launch of a settled run held and drew, measured once

Revision ID: 0023_run_costs
Revises: 0022_leases

A usage report over thousands of runs read every power sample of each run without an energy counter, and every
server process did so again after each start (bench/usage.py). A run settled (ended a while ago, its last batches
in) is measured once and kept here, a row per launch; the rows go with their run. The table starts empty: the first
report after this migration measures the settled runs and writes them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023_run_costs"
down_revision: str | None = "0022_leases"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_costs",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("attempt", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("run_ended_at", sa.DateTime(), nullable=False),
        sa.Column("launched", sa.Float(), nullable=True),
        sa.Column("ended", sa.Float(), nullable=True),
        sa.Column("device", sa.String(3), nullable=False),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("device_hours", sa.Float(), nullable=False),
        sa.Column("kwh", sa.Float(), nullable=True),
        sa.Column("energy_method", sa.String(32), nullable=False),
        sa.Column("gpu_models", sa.JSON(), nullable=False),
        sa.Column("goodput", sa.Float(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("run_costs")
