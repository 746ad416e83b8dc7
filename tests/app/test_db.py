"""The schema comes from migrations only; the server creates a fresh one and refuses one it does not know."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from app.db import make_engine, prepare_schema, upgrade
from app.errors import SchemaMismatch
from app.main import create_app
from app.models import Base
from app.settings import Settings


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
        assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0001"


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
