"""A fresh PostgreSQL schema per test, so tests share one database without seeing each other."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import make_url

from metasrv.sql import engine_url


@contextmanager
def fresh_schema(postgres_url: str) -> Iterator[str]:
    """Create schema `t<hex>`; yield a URL whose search_path is only that schema; drop it."""
    base = engine_url(postgres_url)
    schema = f"t{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, poolclass=pool.NullPool)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()
