"""login failures: counted in the database, so that every worker sees every failed login

Revision ID: 0025_login_failures
Revises: 0024_chunk_tails

With `rankboard serve --workers N` each worker counted the failed logins it saw in its own memory, and a guesser
whose connections landed on every worker got N times RANKBOARD_LOGIN_ATTEMPTS. A row per failure and key (the SHA-256
of the user name tried, of the client address); rows older than the window go as new ones come. The table starts empty.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025_login_failures"
down_revision: str | None = "0024_chunk_tails"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "login_failures",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_login_failures_key_at", "login_failures", ["key", "at"])
    op.create_index("ix_login_failures_at", "login_failures", ["at"])


def downgrade() -> None:
    op.drop_table("login_failures")
