"""checkpoint retention and start-from-checkpoint options of a run

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        batch_op.add_column(sa.Column("keep_last", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("keep_best", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("best_metric", sa.String(length=50), nullable=False, server_default="loss"))
        batch_op.add_column(sa.Column("init_from", sa.String(length=1000), nullable=True))
        batch_op.add_column(sa.Column("init_optimizer", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        for column in ("init_optimizer", "init_from", "best_metric", "keep_best", "keep_last"):
            batch_op.drop_column(column)
