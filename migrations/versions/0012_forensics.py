"""forensics: the run's newest "dump every rank" request, which the ingest reply hands to the ranks; the trainer
options to stop at the first non-finite loss and to compare the replicas' fingerprints;
runs re-run with desync checks

Revision ID: 0012_forensics
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_forensics"
down_revision: str | None = "0010"  # the lead re-chains parallel branches' migrations when merging
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("dump_request", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("dump_requested_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("stop_on_nonfinite", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("fingerprint_every", sa.Integer(), nullable=False, server_default="100"))
        batch.add_column(sa.Column("desync_checks", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("desync_checks")
        batch.drop_column("fingerprint_every")
        batch.drop_column("stop_on_nonfinite")
        batch.drop_column("dump_requested_at")
        batch.drop_column("dump_request")
