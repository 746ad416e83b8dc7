"""a run's configuration as one JSON document: the trainer's options leave their columns for `runs.config`

Revision ID: 0017_run_config
Revises: 0016_recent_head

A built-in run's options, every one, move into `config`; a script's run keeps there only its arguments and its desync
checks (the options it was stored with were placeholders it never ran with); a run launched elsewhere keeps what its
script reported, and loses its placeholder options (epochs 0, lr 0.0). The runs are rewritten BATCH at a time, by
id, in the migration's one transaction: memory stays bounded by BATCH, and a migration cut short leaves the store as
it was. Then the columns are dropped in place (SQLite 3.35 and later): Alembic's batch mode would rebuild `runs`, and
dropping the old table cascades to every run's events and points. Downgrade puts the columns back, each run's values
from its document, and the defaults (placeholders for a run launched elsewhere) where it has none.

The options are listed here as they were at this revision, not read from the app, so that this migration does the
same whenever it runs.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0017_run_config"
down_revision: str | None = "0016_recent_head"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 1000
EXTERNAL = "external"
# (name, column type, the option's default, the column's server default), in the order the columns were added. The
# first five had no server default: a run launched elsewhere stored 0 in them.
OPTIONS: list[tuple[str, sa.types.TypeEngine[Any], object, object]] = [
    ("epochs", sa.Integer(), 10, "0"),
    ("batch_size", sa.Integer(), 64, "0"),
    ("lr", sa.Float(), 0.001, "0"),
    ("checkpoint_every", sa.Integer(), 1, "0"),
    ("seed", sa.Integer(), 0, "0"),
    ("keep_last", sa.Integer(), 0, "0"),
    ("keep_best", sa.Integer(), 0, "0"),
    ("best_metric", sa.String(50), "loss", "loss"),
    ("init_from", sa.String(1000), "", None),
    ("init_optimizer", sa.Boolean(), False, sa.false()),
    ("optimizer", sa.String(16), "adamw", "adamw"),
    ("lr_schedule", sa.String(16), "constant", "constant"),
    ("warmup_steps", sa.Integer(), 0, "0"),
    ("weight_decay", sa.Float(), 0.0, "0"),
    ("grad_clip", sa.Float(), 0.0, "0"),
    ("grad_accum", sa.Integer(), 1, "1"),
    ("precision", sa.String(8), "off", "off"),
    ("sync_batchnorm", sa.Boolean(), False, sa.false()),
    ("find_unused_parameters", sa.Boolean(), False, sa.false()),
    ("bucket_cap_mb", sa.Integer(), 25, "25"),
    ("gradient_as_bucket_view", sa.Boolean(), False, sa.false()),
    ("val_every", sa.Integer(), 0, "0"),
    ("checkpoint_unit", sa.String(8), "epoch", "epoch"),
    ("pg_timeout_s", sa.Integer(), 60, "60"),
    ("stop_on_nonfinite", sa.Boolean(), False, sa.false()),
    ("fingerprint_every", sa.Integer(), 100, "100"),
    ("desync_checks", sa.Boolean(), False, sa.false()),
    ("preflight", sa.String(8), "warn", "warn"),
]
SCRIPT_ARGS = ("script_args", sa.JSON())


def runs_table(*columns: sa.ColumnClause[Any]) -> sa.TableClause:
    """`runs` with what tells a run's kind, its document, and these columns."""
    kind = (sa.column("id", sa.Integer()), sa.column("launcher", sa.String()), sa.column("script", sa.String()))
    return sa.table("runs", *kind, sa.column("config", sa.JSON(none_as_null=True)), *columns)


def option_columns() -> list[sa.ColumnClause[Any]]:
    return [sa.column(name, type_) for name, type_, _default, _server in OPTIONS] + [sa.column(*SCRIPT_ARGS)]


def batches(table: sa.TableClause) -> Iterator[Sequence[sa.Row[Any]]]:
    """Every run, BATCH at a time, by id."""
    after = 0
    while rows := op.get_bind().execute(sa.select(table).where(table.c.id > after).order_by(table.c.id)
                                        .limit(BATCH)).all():  # fmt: skip
        yield rows
        after = rows[-1].id


def document(row: sa.Row[Any]) -> dict[str, Any]:
    """A launched run's config document: a script's arguments (and its desync checks, which reach it as torch's own),
    or a built-in run's every option, each of its option's type."""
    if row.script is not None:
        return {"script_args": row.script_args or [], "desync_checks": bool(row.desync_checks)}
    values = {name: (getattr(row, name), default) for name, _type, default, _server in OPTIONS}
    return {name: default if value is None else type(default)(value) for name, (value, default) in values.items()}


def upgrade() -> None:
    table = runs_table(*option_columns())
    write = sa.update(table).where(table.c.id == sa.bindparam("run_id")).values(config=sa.bindparam("document"))
    for rows in batches(table):
        launched = [row for row in rows if row.launcher != EXTERNAL]  # one launched elsewhere keeps its document
        if launched:
            op.get_bind().execute(write, [{"run_id": row.id, "document": document(row)} for row in launched])
    for name, *_rest in [*OPTIONS, SCRIPT_ARGS]:
        op.drop_column("runs", name)
    if op.get_bind().dialect.name == "postgresql":  # binary JSON: a key is read without parsing the whole text
        op.alter_column("runs", "config", type_=JSONB(), existing_type=sa.JSON(), postgresql_using="config::jsonb")


def columns(row: sa.Row[Any]) -> dict[str, Any]:
    """A launched run's old columns, from its document (the defaults where it has none), and no document."""
    found = row.config or {}
    values = {f"new_{name}": found.get(name, default) for name, _type, default, _server in OPTIONS}
    return {**values, "new_init_from": values["new_init_from"] or None,
            "new_script_args": found.get("script_args", []), "new_config": None, "run_id": row.id}  # fmt: skip


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("runs", "config", type_=sa.JSON(), existing_type=JSONB(), postgresql_using="config::json")
    # A run launched elsewhere gets the columns' defaults: the placeholders it had before (epochs 0, lr 0.0).
    for name, type_, _default, server in OPTIONS:
        op.add_column("runs", sa.Column(name, type_, nullable=server is None, server_default=server))  # type: ignore[arg-type]
    op.add_column("runs", sa.Column(*SCRIPT_ARGS, nullable=True))
    table = runs_table(*option_columns())
    names = ["config", *(column.name for column in option_columns())]
    write = sa.update(table).where(table.c.id == sa.bindparam("run_id"))
    write = write.values({name: sa.bindparam(f"new_{name}") for name in names})
    for rows in batches(runs_table()):
        launched = [columns(row) for row in rows if row.launcher != EXTERNAL]
        if launched:
            op.get_bind().execute(write, launched)
