"""The database: engine with SQLite's pragmas, sessions, and the schema-version gate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.orm import Session, sessionmaker

from app.core.errors import SchemaMismatch

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def make_engine(url: str) -> Engine:
    """An engine for `url`; on SQLite every connection gets WAL, foreign keys and a busy timeout."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the single writer
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable at each checkpoint of the WAL; safe with WAL
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")  # wait for a writer instead of failing "database is locked"
    cursor.close()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """Opens a session and always closes it; the service decides when to begin and commit."""
    with factory() as db:
        yield db


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str) -> None:
    """Brings the database at `url` to the newest schema."""
    command.upgrade(alembic_config(url), "head")


def prepare_schema(engine: Engine, url: str) -> None:
    """Creates a fresh database's schema; refuses a database whose schema this code does not know or is behind."""
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
        tables = set(inspect(connection).get_table_names())
    if current is None and not tables:
        upgrade(url)
        return
    if current == head:
        return
    if current is None:
        raise SchemaMismatch(f"the database has tables ({', '.join(sorted(tables))}) but no Rankboard schema version")
    known = {rev.revision for rev in ScriptDirectory.from_config(alembic_config(url)).walk_revisions()}
    if current in known:
        raise SchemaMismatch(f"the database schema is at {current}, behind {head}: run `rankboard db upgrade`")
    raise SchemaMismatch(f"the database schema {current} is unknown to this Rankboard (newest known: {head})")
