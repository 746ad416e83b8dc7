"""runs through Slurm: where a run runs, its Slurm options, and the job as Slurm last described it

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (name, type, server default); None: nullable with no default.
RUN_COLUMNS: list[tuple[str, sa.types.TypeEngine, object]] = [
    ("launcher", sa.String(16), "local"),
    ("slurm_nodes", sa.Integer(), "1"),
    ("slurm_gpus_per_node", sa.Integer(), "0"),
    ("slurm_cpus_per_task", sa.Integer(), "1"),
    ("slurm_time_limit", sa.String(32), None),
    ("slurm_partition", sa.String(64), None),
    ("slurm_account", sa.String(64), None),
    ("slurm_qos", sa.String(64), None),
    ("slurm_constraint", sa.String(200), None),
    ("slurm_requeue", sa.Boolean(), sa.false()),
    ("slurm_max_requeues", sa.Integer(), "1"),
    ("job_id", sa.String(32), None),
    ("job_state", sa.String(32), None),
    ("job_reason", sa.String(200), None),
    ("node_list", sa.Text(), None),
]


def upgrade() -> None:
    # Plain ADD COLUMN, never a batch copy: on SQLite a batch drops and recreates `runs`, and with foreign keys on,
    # dropping it cascades into every run's metrics and events.
    for name, type_, default in RUN_COLUMNS:
        if default is None:
            op.add_column("runs", sa.Column(name, type_, nullable=True))
        else:
            op.add_column("runs", sa.Column(name, type_, nullable=False, server_default=default))  # type: ignore[arg-type]


def downgrade() -> None:
    for name, _type, _default in reversed(RUN_COLUMNS):
        op.drop_column("runs", name)  # SQLite 3.35 and later drop a column in place
