"""steps in 64 bits: GPU samples are keyed by unix seconds, and a step past 2**31 must not fail an ingest

Revision ID: 0005
Revises: 0004

SQLite's INTEGER already holds 64 bits, so only PostgreSQL changes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = [
    ("runs", "step"),
    ("runs", "total_steps"),
    ("runs", "pid_start_ticks"),
    ("metric_points", "step"),
    ("run_ranks", "step"),
    ("metric_tiers", "bucket"),
    ("metric_tiers", "last_step"),
]


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.BigInteger(), existing_type=sa.Integer())


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.Integer(), existing_type=sa.BigInteger())
