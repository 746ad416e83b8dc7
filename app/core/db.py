"""The database: engine with SQLite's pragmas, sessions, and the schema-version gate.

Alembic is imported only to change a schema or to explain one that is not current: at a start on a current schema
the gate reads the version row and the migration files' revision lines, where loading Alembic and its scripts
(each migration a module, numpy and the store with some) took a sixth of the server's start.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.orm import Session, sessionmaker

from app.core import pg_arrays
from app.core.errors import SchemaMismatch

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
# A migration's own revision and the one it follows, as every file in migrations/versions writes them.
_REVISION_LINE = re.compile(r'^(revision|down_revision)\b[^=\n]*=\s*"([^"]+)"', re.MULTILINE)


def make_engine(url: str) -> Engine:
    """An engine for `url`; on SQLite every connection gets WAL, foreign keys and a busy timeout."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_engine(url, pool_pre_ping=True)
    if engine.dialect.driver == "psycopg":
        event.listen(engine, "connect", pg_arrays.register)
    return engine


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
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str) -> None:
    """Brings the database at `url` to the newest schema."""
    from alembic import command

    command.upgrade(alembic_config(url), "head")


def schema_head() -> str | None:
    """The newest migration's revision, from the files' text: the one that no other follows; None when the files
    do not name exactly one (Alembic then decides)."""
    own: set[str] = set()
    followed: set[str] = set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        for name, revision in _REVISION_LINE.findall(path.read_text()):
            (own if name == "revision" else followed).add(revision)
    heads = own - followed
    return heads.pop() if len(heads) == 1 else None


def prepare_schema(engine: Engine, url: str) -> None:
    """Creates a fresh database's schema; refuses a database whose schema this code does not know or is behind."""
    with engine.connect() as connection:
        tables = set(inspect(connection).get_table_names())
        versions: list[str] = []
        if "alembic_version" in tables:
            versions = list(connection.execute(text("SELECT version_num FROM alembic_version")).scalars())
    if not versions and not tables:
        upgrade(url)
        return
    if len(versions) == 1 and versions[0] == schema_head():
        return
    _refuse(url, versions[0] if len(versions) == 1 else None, tables)


def _refuse(url: str, current: str | None, tables: set[str]) -> None:
    """Why the schema is not this code's, as a SchemaMismatch; returns when Alembic finds it current after all."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config(url))
    head = scripts.get_current_head()
    if current == head:
        return
    if current is None:
        raise SchemaMismatch(f"the database has tables ({', '.join(sorted(tables))}) but no Rankboard schema version")
    if current in {rev.revision for rev in scripts.walk_revisions()}:
        raise SchemaMismatch(f"the database schema is at {current}, behind {head}: run `rankboard db upgrade`")
    raise SchemaMismatch(f"the database schema {current} is unknown to this Rankboard (newest known: {head})")
