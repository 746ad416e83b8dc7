"""The schema comes from migrations only; the server creates a fresh one and refuses one it does not know."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.command import upgrade as upgrade_to
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from app.core.db import alembic_config, make_engine, prepare_schema, upgrade
from app.core.errors import SchemaMismatch
from app.core.models import Base
from app.core.settings import Settings
from app.main import create_app


def test_migrations_build_exactly_the_schema_the_models_describe(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    with make_engine(url).connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []


def test_every_connection_gets_wal_foreign_keys_and_a_busy_timeout(tmp_path: Path) -> None:
    with make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}").connect() as connection:
        pragmas = {
            name: connection.execute(text(f"PRAGMA {name}")).scalar()
            for name in ("journal_mode", "foreign_keys", "busy_timeout")
        }
    assert pragmas == {"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": 30000}


def test_a_fresh_database_is_created_and_a_second_start_reuses_it(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, shared_dir=tmp_path / "shared")
    create_app(settings)
    create_app(settings)
    with make_engine(settings.sqlalchemy_url).connect() as connection:
        version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    assert version == ScriptDirectory.from_config(alembic_config(settings.sqlalchemy_url)).get_current_head()


def test_an_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(SchemaMismatch, match="unknown to this Rankboard"):
        prepare_schema(engine, url)


def test_tables_without_a_schema_version_are_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE runs (id INTEGER PRIMARY KEY)"))
    with pytest.raises(SchemaMismatch, match="no Rankboard schema version"):
        prepare_schema(engine, url)


def test_an_older_schema_is_refused_until_upgraded_and_the_upgrade_keeps_the_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to(alembic_config(url), "0001")
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO runs (name, status, status_reason, created_at, workload, nproc_per_node, epochs, batch_size,"
            " lr, checkpoint_every, seed, epoch, step, total_steps, samples_per_s, trainer_finished)"
            " VALUES ('old', 'succeeded', '', '2026-01-01 00:00:00', 'mlp', 2, 1, 64, 0.001, 1, 0, 1, 10, 10, 0, 1)"
        ))  # fmt: skip
    with pytest.raises(SchemaMismatch, match="rankboard db upgrade"):
        prepare_schema(engine, url)
    upgrade(url)
    prepare_schema(engine, url)
    with engine.connect() as connection:
        row = connection.execute(text("SELECT name, keep_last, best_metric, init_from FROM runs")).one()
    assert tuple(row) == ("old", 0, "loss", None)
