"""Alembic migrations on real SQLite and PostgreSQL: create, match the metadata, drop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, pool, select

import migrations
from metasrv.sql import kv_revision_table, metadata

METASRV_TABLES = set(metadata.tables)
# The console script installed next to this interpreter.
METASRV = str(Path(sys.executable).parent / "metasrv")


def _tables(url: str) -> set[str]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_creates_every_table_and_downgrade_removes_them(empty_db_url: str) -> None:
    assert _tables(empty_db_url) == set()
    assert migrations.current_revision(empty_db_url) is None

    migrations.upgrade(empty_db_url)

    assert _tables(empty_db_url) == METASRV_TABLES
    assert migrations.current_revision(empty_db_url) == migrations.head_revision()

    migrations.downgrade(empty_db_url, "base")

    assert _tables(empty_db_url) == set()
    assert migrations.current_revision(empty_db_url) is None


def test_migrated_schema_matches_metadata(empty_db_url: str) -> None:
    migrations.upgrade(empty_db_url)
    engine = create_engine(empty_db_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, metadata)
            revision_rows = conn.execute(select(kv_revision_table)).all()
    finally:
        engine.dispose()
    assert diff == []
    # The kv backend's global revision counter starts at 0 in its single row, no delete yet.
    assert [tuple(r) for r in revision_rows] == [(1, 0, 0)]


def test_upgrade_is_idempotent(empty_db_url: str) -> None:
    migrations.upgrade(empty_db_url)
    migrations.upgrade(empty_db_url)
    assert _tables(empty_db_url) == METASRV_TABLES


def test_cli_upgrade_and_downgrade_from_another_directory(tmp_path: Path) -> None:
    """`metasrv db upgrade` finds its scripts from any cwd (they ship inside the package)."""
    db = tmp_path / "cli.db"
    url = f"sqlite:///{db}"
    cli = [METASRV, "db"]
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    up = subprocess.run(
        [*cli, "upgrade", "--url", url], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert up.returncode == 0, up.stderr
    assert f"at {migrations.head_revision()}" in up.stdout
    assert _tables(url) == METASRV_TABLES

    down = subprocess.run(
        [*cli, "downgrade", "--url", url, "--yes"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert down.returncode == 0, down.stderr
    assert "at base" in down.stdout
    assert _tables(url) == set()


def test_cli_upgrade_reports_unreachable_database(tmp_path: Path) -> None:
    url = "postgresql://nobody:secret@127.0.0.1:1/none"
    run = subprocess.run(
        [METASRV, "db", "upgrade", "--url", url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert "migrating postgresql://nobody:***@127.0.0.1:1/none failed" in run.stderr
    assert "secret" not in run.stderr
    assert "Traceback" not in run.stderr
