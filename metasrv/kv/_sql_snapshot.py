"""`KvBackend.snapshot()` on SQL: the store as of one revision, read by prefix.

`SqlKv.snapshot` opens one read-only transaction (REPEATABLE READ on PostgreSQL; on SQLite's
WAL a deferred transaction reads one snapshot) whose first read is the revision row, so
the revision and every page describe the same instant. Each prefix is read straight from
a DBAPI cursor (a server-side one on PostgreSQL) in plain tuples: no SQLAlchemy row per key.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Dialect, and_, func, select, text
from sqlalchemy.engine import Connection

from metasrv.errors import InvalidArgument, KvUnavailable
from metasrv.kv._common import prefix_upper_bound
from metasrv.kv._protocol import KeyPage
from metasrv.sql import kv_table


def snapshot_error(database: str, exc: Exception) -> KvUnavailable:
    """A database error of a snapshot read, naming the `database` (a batch job shows it)."""
    lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    detail = lines[0] if lines else type(exc).__name__
    return KvUnavailable(f"kv database {database} unreachable: {detail}")


def _select_prefix(dialect: Dialect, key_prefix: str, prefix: str) -> tuple[str, Any]:
    """SQL text and driver parameters selecting (bare key, value) under `prefix`."""
    lo = key_prefix + prefix
    hi = prefix_upper_bound(lo)
    if dialect.name == "sqlite":
        # `+key` keeps SQLite off the primary-key index: walking the index visits the
        # table in key order, page by random page (6x slower than one scan in rowid
        # order for a prefix that is most of the table). PostgreSQL's planner picks.
        bound = "+key >= :lo" if hi is None else "+key >= :lo AND +key < :hi"
        in_range: Any = text(bound).bindparams(lo=lo, **({} if hi is None else {"hi": hi}))
    else:
        col = kv_table.c.key
        in_range = col >= lo if hi is None else and_(col >= lo, col < hi)
    # The database cuts the key prefix, so the driver hands over keys ready to use.
    stmt = select(func.substr(kv_table.c.key, len(key_prefix) + 1), kv_table.c.value)
    compiled = stmt.where(in_range).compile(dialect=dialect)
    params: Any = compiled.params
    if compiled.positional:
        params = tuple(params[name] for name in compiled.positiontup or ())
    return compiled.string, params


class SqlSnapshot:
    """`Snapshot` on SQL: statements of `conn`, inside the snapshot's transaction, of the
    keys under `key_prefix`; `database` names the store in errors."""

    def __init__(self, conn: Connection, key_prefix: str, revision: int, database: str) -> None:
        self._conn = conn
        self._dialect = conn.dialect
        self._key_prefix = key_prefix
        self._revision = revision
        self._database = database
        self._cursors: dict[int, Any] = {}
        self._names = itertools.count()
        self._dbapi_error: type[Exception] = conn.dialect.loaded_dbapi.Error
        self.open = True

    @property
    def revision(self) -> int:
        return self._revision

    def pages(self, prefix: str, *, page_size: int = 1000) -> Iterator[KeyPage]:
        if page_size <= 0:
            raise InvalidArgument(f"page_size must be positive, got {page_size}")
        return self._pages(*_select_prefix(self._dialect, self._key_prefix, prefix), page_size)

    def _pages(self, sql: str, params: Any, page_size: int) -> Iterator[KeyPage]:
        if not self.open:
            raise KvUnavailable("kv snapshot read after its `with` block ended")
        dbapi = self._conn.connection.driver_connection
        assert dbapi is not None
        if self._dialect.name == "postgresql":
            cursor = dbapi.cursor(name=f"metasrv_kv_snapshot_{next(self._names)}")
        else:
            cursor = dbapi.cursor()
        self._cursors[id(cursor)] = cursor
        try:
            cursor.execute(sql, params)
            while self.open and (rows := cursor.fetchmany(page_size)):
                keys, values = zip(*rows, strict=True)
                yield KeyPage(keys, values)
        except self._dbapi_error as exc:
            raise snapshot_error(self._database, exc) from exc
        finally:
            self._cursors.pop(id(cursor), None)
            cursor.close()
        if not self.open:
            raise KvUnavailable("kv snapshot read after its `with` block ended")

    def close(self) -> None:
        """Close the cursors of pages not read to the end, before the transaction ends."""
        self.open = False
        for cursor in list(self._cursors.values()):
            cursor.close()
        self._cursors.clear()
