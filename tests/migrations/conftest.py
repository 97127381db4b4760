"""Fixtures for migration tests: an empty database per test, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.metasrv.kv._pgschema import fresh_schema


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of an empty database: a new SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'metasrv.db'}"
        return
    postgres_url: str = request.getfixturevalue("postgres_url")
    with fresh_schema(postgres_url) as url:
        yield url
