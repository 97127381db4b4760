"""Database URLs as metasrv's engines open them."""

from __future__ import annotations

from sqlalchemy.engine import make_url


def engine_url(url: str) -> str:
    """`url` with psycopg 3 as the driver of a plain `postgresql://` (or `postgres://`) URL,
    which SQLAlchemy would otherwise open with psycopg2 (not installed); others unchanged."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)
