"""the queue: each run's priority, owner and preemption; limits per user and per group of users

Revision ID: 0020_queue
Revises: 0018_tier_times

Columns are added, never by rebuilding `runs` (Alembic's batch mode on SQLite): dropping the old table would cascade
to every run's series and points through their foreign keys. A stored run's owner is the user its creator acted for:
`created_by` without the " (token NAME)" that a token's actor adds.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_queue"
down_revision: str | None = "0018_tier_times"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    sa.Column("slurm_nice", sa.Integer(), nullable=True),
    sa.Column("owner", sa.String(200), nullable=True),
    sa.Column("priority", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("preemptible", sa.Boolean(), nullable=False, server_default=sa.true()),
    sa.Column("preempted_by", sa.Integer(), nullable=True),
    sa.Column("preempted_at", sa.DateTime(), nullable=True),
)
TOKEN_SUFFIX = " (token "


def owner_of(actor: str) -> str:
    """The user an actor's name stands for: "ada (token ci)" is ada."""
    return actor.split(TOKEN_SUFFIX, 1)[0] if actor.endswith(")") else actor


def upgrade() -> None:
    for column in COLUMNS:
        op.add_column("runs", column)
    bind = op.get_bind()
    actors = bind.execute(sa.text("SELECT DISTINCT created_by FROM runs WHERE created_by IS NOT NULL")).scalars()
    fill = sa.text("UPDATE runs SET owner = :owner WHERE created_by = :actor")
    for actor in list(actors):
        bind.execute(fill, {"owner": owner_of(actor), "actor": actor})
    op.create_index("ix_runs_owner", "runs", ["owner"])
    op.create_table(
        "user_limits",
        sa.Column("user_name", sa.String(64), primary_key=True),
        sa.Column("max_slots", sa.Integer(), nullable=True),
        sa.Column("max_runs", sa.Integer(), nullable=True),
    )
    op.create_table(
        "user_groups",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("max_slots", sa.Integer(), nullable=True),
        sa.Column("max_runs", sa.Integer(), nullable=True),
    )
    op.create_table(
        "group_members",
        sa.Column("group_id", sa.Integer(), sa.ForeignKey("user_groups.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("user_name", sa.String(64), primary_key=True),
    )
    op.create_index("ix_group_members_user_name", "group_members", ["user_name"])


def downgrade() -> None:
    op.drop_index("ix_group_members_user_name", table_name="group_members")
    op.drop_table("group_members")
    op.drop_table("user_groups")
    op.drop_table("user_limits")
    op.drop_index("ix_runs_owner", table_name="runs")
    for column in reversed(COLUMNS):
        op.drop_column("runs", column.name)
