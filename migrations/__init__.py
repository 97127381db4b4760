"""Alembic migrations for every SQL table metasrv stores, driven programmatically.

`alembic.ini` and the scripts live in this package, so `upgrade(url)` works from any
working directory and from an installed wheel. The database URL is handed to env.py
through `Config.attributes` (never through the ini file, whose interpolation would
mangle `%` in passwords).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

_HERE = Path(__file__).resolve().parent

__all__ = ["alembic_config", "current_revision", "downgrade", "head_revision", "upgrade"]


def alembic_config(url: str) -> Config:
    """An Alembic `Config` pointing at this package's scripts and at database `url`."""
    cfg = Config(str(_HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(_HERE))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at `url` up to `revision` (idempotent at head)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Migrate the database at `url` down to `revision` ("base" drops every table)."""
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    """The newest migration id shipped with this package."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    if head is None:
        raise RuntimeError("no migrations found")
    return head


def current_revision(url: str) -> str | None:
    """The migration id the database at `url` is at, or None when unmigrated."""
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
