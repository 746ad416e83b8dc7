"""leases (exactly one server process supervises) and ingest totals (counted across server processes)

Revision ID: 0022_leases
Revises: 0021_sample_chunks

`rankboard serve --workers N` on PostgreSQL runs N server processes on one database: the supervisor's lease says
which of them starts and finishes runs and sends alerts, and every process adds what it ingested to one row of
totals, which /metrics reads. Both tables start empty: their rows are made by the first process that needs them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022_leases"
down_revision: str | None = "0021_sample_chunks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(200), nullable=True),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "ingest_totals",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("batches", sa.BigInteger(), nullable=False),
        sa.Column("accepted", sa.BigInteger(), nullable=False),
        sa.Column("stored", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("ingest_totals")
    op.drop_table("leases")
