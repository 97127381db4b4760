"""Alembic environment: run migrations against the URL given by `migrations.alembic_config`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import Connection

from metasrv.sql import is_sqlite, metadata

config = context.config


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: use `metasrv db upgrade --url URL`")
    return str(url)


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds tables for later migrations.
        render_as_batch=is_sqlite(_url()),
        compare_type=True,
        **kwargs,  # type: ignore[arg-type]
    )


def _run(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
