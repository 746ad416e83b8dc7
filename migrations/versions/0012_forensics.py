"""forensics: the run's newest "dump every rank" request, which the ingest reply hands to the ranks; the trainer
options to stop at the first non-finite loss and to compare the replicas' fingerprints;
runs re-run with desync checks

Revision ID: 0012_forensics
Revises: 0014
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_forensics"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN: Alembic's batch mode rebuilds `runs` on SQLite, and dropping the old table cascades to every
    # run's events, series and points.
    op.add_column("runs", sa.Column("dump_request", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("dump_requested_at", sa.DateTime(), nullable=True))
    op.add_column("runs", sa.Column("stop_on_nonfinite", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("runs", sa.Column("fingerprint_every", sa.Integer(), nullable=False, server_default="100"))
    op.add_column("runs", sa.Column("desync_checks", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    # Not batch mode: on SQLite it rebuilds `runs`, and dropping the old table cascades to every series and point.
    for column in ("desync_checks", "fingerprint_every", "stop_on_nonfinite", "dump_requested_at", "dump_request"):
        op.drop_column("runs", column)
