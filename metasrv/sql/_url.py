"""Database URLs as metasrv's engines open them, and the embedded SQLite default.

Without a configuration every store is a SQLite file, which `metasrv start` migrates itself
(`migrate_embedded`); PostgreSQL, and any store a configuration names, is migrated by the
operator (`metasrv db upgrade`). An in-memory SQLite database (`sqlite://`) has no file.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url


def engine_url(url: str) -> str:
    """`url` with psycopg 3 as the driver of a plain `postgresql://` (or `postgres://`) URL,
    which SQLAlchemy would otherwise open with psycopg2 (not installed); others unchanged."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def is_sqlite(url: str) -> bool:
    """True for a SQLite database, a file or in memory."""
    return make_url(url).get_backend_name() == "sqlite"


def is_memory_sqlite(url: str) -> bool:
    """True for an in-memory SQLite database, which no other connection or process sees."""
    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite file URL, resolved as SQLAlchemy opens it (against the working
    directory); None for an in-memory SQLite or another database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(str(parsed.database)).resolve()


def migrate_embedded(url: str) -> bool:
    """Migrate a SQLite file to the newest schema, as an embedded store is migrated when it
    is opened; False, and nothing done, for any other database."""
    if sqlite_file(url) is None:
        return False
    import migrations  # Alembic's scripts: loaded only when a file is migrated

    migrations.upgrade(engine_url(url))
    return True
