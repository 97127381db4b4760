"""A throw-away, migrated PostgreSQL schema for benchmarks (not a benchmark itself)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import make_url

import migrations
from metasrv.sql import engine_url


@contextmanager
def fresh_pg_schema(url: str) -> Iterator[str]:
    """A migrated throw-away schema; yields a URL whose search_path is that schema."""
    base = engine_url(url)
    schema = f"bench{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, poolclass=pool.NullPool)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        scoped = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
        scoped_url = scoped.render_as_string(hide_password=False)
        migrations.upgrade(scoped_url)
        yield scoped_url
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()
