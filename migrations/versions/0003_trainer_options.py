"""the trainer's DDP options, bring-your-own-script runs, restarts, GPUs seen, and per-rank heartbeats

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (name, type, server default); None: nullable with no default.
RUN_COLUMNS: list[tuple[str, sa.types.TypeEngine, object]] = [
    ("optimizer", sa.String(16), "adamw"),
    ("lr_schedule", sa.String(16), "constant"),
    ("warmup_steps", sa.Integer(), "0"),
    ("weight_decay", sa.Float(), "0"),
    ("grad_clip", sa.Float(), "0"),
    ("grad_accum", sa.Integer(), "1"),
    ("precision", sa.String(8), "off"),
    ("sync_batchnorm", sa.Boolean(), sa.false()),
    ("find_unused_parameters", sa.Boolean(), sa.false()),
    ("bucket_cap_mb", sa.Integer(), "25"),
    ("gradient_as_bucket_view", sa.Boolean(), sa.false()),
    ("val_every", sa.Integer(), "0"),
    ("checkpoint_unit", sa.String(8), "epoch"),
    ("max_restarts", sa.Integer(), "0"),
    ("pg_timeout_s", sa.Integer(), "60"),
    ("nccl_env", sa.JSON(), None),
    ("script", sa.String(1000), None),
    ("script_args", sa.JSON(), None),
    ("restarts", sa.Integer(), "0"),
    ("gpus", sa.JSON(), None),
]


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        for name, type_, default in RUN_COLUMNS:
            if default is None:
                batch_op.add_column(sa.Column(name, type_, nullable=True))
            else:
                batch_op.add_column(sa.Column(name, type_, nullable=False, server_default=default))  # type: ignore[arg-type]
    op.create_table(
        "run_ranks",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("rank", sa.Integer(), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_ranks")
    with op.batch_alter_table("runs") as batch_op:
        for name, _type, _default in reversed(RUN_COLUMNS):
            batch_op.drop_column(name)
