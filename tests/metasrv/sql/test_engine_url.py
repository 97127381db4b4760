"""`metasrv.sql.engine_url`: the one place a database URL gets its driver."""

from __future__ import annotations

import pytest

from metasrv.sql import engine_url


@pytest.mark.parametrize(
    ("given", "opened"),
    [
        ("postgresql://u:p%40ss@db:5432/m", "postgresql+psycopg://u:p%40ss@db:5432/m"),
        (
            "postgres://u:secret@db/m?sslmode=require",
            "postgresql+psycopg://u:secret@db/m?sslmode=require",
        ),
        ("postgresql+psycopg://u:p@db/m", "postgresql+psycopg://u:p@db/m"),
        ("sqlite:///metasrv-kv.db", "sqlite:///metasrv-kv.db"),
        ("sqlite://", "sqlite://"),
    ],
)
def test_plain_postgres_urls_get_psycopg3_and_keep_their_password(given: str, opened: str) -> None:
    assert engine_url(given) == opened
