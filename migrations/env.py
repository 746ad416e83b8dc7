"""Alembic's entry point: runs migrations on the URL the caller configured (`app.core.db.alembic_config`)."""

from alembic import context

from app.core.db import make_engine
from app.core.models import Base

config = context.config


def run_migrations() -> None:
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()
