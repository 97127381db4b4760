"""Whether a SQL store carries the schema this build needs (the newest Alembic migration).

`/readyz` uses it on the history database, so a process whose history was never migrated
is not ready (a purge would otherwise fail only at its last step); `metasrv start` logs the
`metasrv db upgrade` command that fixes it. Messages name no address or password.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

import sqlalchemy.exc as sa_exc
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine

import migrations
from metasrv.errors import Unavailable

logger = logging.getLogger(__name__)


def upgrade_command(config: Path | None) -> str:
    """The exact command that migrates the databases `config` names."""
    if config is None:
        return "metasrv db upgrade"
    return f"metasrv db upgrade -c {shlex.quote(str(config.resolve()))}"


def schema_problem(engine: Engine, store: str = "history") -> str | None:
    """Why `engine`'s database lacks the newest schema, or None when it has it.
    Raises `Unavailable` (without the database's address) when it does not answer."""
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
    except sa_exc.SQLAlchemyError as exc:
        logger.debug("schema check failed", extra={"store": store, "error": str(exc)})
        raise Unavailable(f"{store} database unreachable ({type(exc).__name__})") from exc
    head = migrations.head_revision()
    if current == head:
        return None
    if current is None:
        return f"{store} database has no schema: run `metasrv db upgrade`"
    return (
        f"{store} database schema is at migration {current}, not {head}: run `metasrv db upgrade`"
    )


def require_schema(engine: Engine, store: str = "history") -> None:
    """Raise `Unavailable` unless the database has the newest schema (the readiness check)."""
    problem = schema_problem(engine, store)
    if problem is not None:
        raise Unavailable(problem)
