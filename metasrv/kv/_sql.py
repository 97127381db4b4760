"""The SQL kv backend: one table of keys on SQLite (embedded default) or PostgreSQL.

Every writing transaction first locks the single row of `metasrv_kv_revision`
(`SELECT ... FOR UPDATE` on PostgreSQL; SQLite serializes writers with
`BEGIN IMMEDIATE`), so compares and writes are atomic and `mod_revision` grows
monotonically across all keys, as etcd's store revision does. Reads take no lock.
Tables come from the Alembic migrations (`metasrv db upgrade`); only `SqlKv.open(...,
create=True)` on a SQLite file runs them itself, so a bare `metasrv start` just works.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

import sqlalchemy.exc as sa_exc
from sqlalchemy import (
    Engine,
    String,
    and_,
    any_,
    bindparam,
    create_engine,
    delete,
    event,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.pool import StaticPool

from metasrv.errors import InvalidArgument, KvUnavailable
from metasrv.kv._common import check_txn_size, collapse_ops, prefix_upper_bound, scan_pages
from metasrv.kv._protocol import (
    BatchUpdate,
    Compare,
    Delete,
    KeyValue,
    KvChange,
    KvWatch,
    Put,
    Snapshot,
    TxnOp,
    TxnResult,
)
from metasrv.kv._sql_snapshot import SqlSnapshot, snapshot_error
from metasrv.kv._sql_watch import SqlWatch
from metasrv.sql import (
    KV_KEY_MAX,
    engine_url,
    is_memory_sqlite,
    kv_revision_table,
    kv_table,
    migrate_embedded,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

SQL_MAX_TXN_OPS = 10_000
"""Largest compares/ops list of one SQL transaction (bounds lock time and statement size)."""

_IN_CHUNK = 500
"""Keys per `IN (...)` list; keeps statements far below driver parameter limits."""

_SQLITE_BUSY_TIMEOUT_MS = 30_000

# One table for translating database errors. OperationalError covers lost connections,
# refused connections, SQLite "database is locked" and missing tables; ProgrammingError
# is what PostgreSQL raises for a missing table (schema not migrated).
_UNAVAILABLE_ERRORS: tuple[tuple[type[Exception], str], ...] = (
    (sa_exc.DisconnectionError, "connection to the kv database was lost"),
    (sa_exc.TimeoutError, "no kv database connection free in the pool"),
    (sa_exc.OperationalError, "kv database unavailable"),
    (sa_exc.InterfaceError, "kv database driver error"),
    (sa_exc.ProgrammingError, "kv database schema missing or broken (run `metasrv db upgrade`)"),
)


def _translate(exc: sa_exc.SQLAlchemyError) -> Exception:
    for cls, message in _UNAVAILABLE_ERRORS:
        if isinstance(exc, cls):
            detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            return KvUnavailable(f"{message}: {detail}")
    return exc


def create_kv_engine(url: str, *, timeout: float | None = None) -> Engine:
    """An engine tuned for the kv workload (SQLite: WAL, busy timeout, IMMEDIATE writers).

    `timeout` (seconds) bounds connecting, lock waits and statements, for callers that
    must not block longer (the election thread); None keeps the generous defaults.
    """
    url = engine_url(url)
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False}}
        if is_memory_sqlite(url):
            # One shared connection, else every pooled connection is a new empty database.
            kwargs["poolclass"] = StaticPool
        engine = create_engine(url, **kwargs)
        busy_ms = _SQLITE_BUSY_TIMEOUT_MS if timeout is None else max(1, int(timeout * 1000))
        _tune_sqlite(engine, busy_ms)
        return engine
    if backend == "postgresql":
        if timeout is None:
            return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)
        ms = max(1, int(timeout * 1000))
        # connect_args replace the URL's own `options` (e.g. a search_path): keep both.
        given = make_url(url).query.get("options", "")
        options = " ".join([*([given] if isinstance(given, str) else given)])
        connect_args = {
            "connect_timeout": max(1, round(timeout)),
            "options": f"{options} -c statement_timeout={ms} -c lock_timeout={ms}".strip(),
        }
        return create_engine(
            url, pool_pre_ping=True, pool_size=1, max_overflow=1, connect_args=connect_args
        )
    raise InvalidArgument(f"unsupported kv database {backend!r}: use sqlite or postgresql")


def _tune_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, emit BEGIN, so writers can ask for IMMEDIATE.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A writer that starts deferred and upgrades later can deadlock with another
        # writer (SQLITE_BUSY without waiting); IMMEDIATE takes the write lock up front.
        mode = "IMMEDIATE" if conn.get_execution_options().get("metasrv_write") else "DEFERRED"
        conn.exec_driver_sql(f"BEGIN {mode}")


class SqlKv:
    """`KvBackend` on a SQL table. `url`: a SQLAlchemy URL (sqlite:///file, postgresql://...)."""

    max_txn_ops: int = SQL_MAX_TXN_OPS

    def __init__(self, url: str, key_prefix: str = "", *, timeout: float | None = None) -> None:
        self.url = engine_url(url)
        self.key_prefix = key_prefix
        self._engine = create_kv_engine(self.url, timeout=timeout)
        self._dialect = self._engine.dialect.name
        # SQLite in memory shares one connection between threads: serialize its use.
        self._mutex: AbstractContextManager[Any] = (
            threading.RLock() if is_memory_sqlite(self.url) else nullcontext()
        )
        self._closed = False

    @classmethod
    def open(cls, url: str, key_prefix: str = "", *, create: bool = False) -> SqlKv:
        """Open the backend; with `create` on SQLite, first migrate the file to the head schema.

        PostgreSQL is never migrated implicitly: run `metasrv db upgrade` for it.
        """
        url = engine_url(url)
        if create:
            migrate_embedded(url)
        kv = cls(url, key_prefix)
        if create and is_memory_sqlite(url):
            # Alembic would migrate a different in-memory database; build this one directly.
            from metasrv.sql import metadata

            with kv._engine.begin() as conn:
                metadata.create_all(conn)
        return kv

    @property
    def engine(self) -> Engine:
        """The underlying engine (tests, tools and the SQL election's own instance)."""
        return self._engine

    @property
    def in_memory(self) -> bool:
        """True for an in-memory SQLite database, which no other process can reach."""
        return is_memory_sqlite(self.url)

    # --- key prefix ------------------------------------------------------------------

    def _full(self, key: str) -> str:
        full = self.key_prefix + key
        if len(full) > KV_KEY_MAX:
            raise InvalidArgument(
                f"kv key is {len(full)} characters with its prefix; the SQL backend "
                f"stores at most {KV_KEY_MAX}"
            )
        return full

    def _bare(self, key: str) -> str:
        return key[len(self.key_prefix) :]

    def _prefix_clause(self, prefix: str) -> Any:
        lo = self.key_prefix + prefix
        hi = prefix_upper_bound(lo)
        col = kv_table.c.key
        return col >= lo if hi is None else and_(col >= lo, col < hi)

    # --- plumbing --------------------------------------------------------------------

    def run_in_transaction(self, fn: Callable[[Connection], _T], *, write: bool) -> _T:
        """`fn(conn)` in one transaction (a writer's: IMMEDIATE on SQLite, when `write`),
        database errors translated to `KvUnavailable`."""
        if self._closed:
            raise KvUnavailable("kv backend is closed")
        try:
            with self._mutex, self._engine.connect() as conn:
                if write:
                    conn = conn.execution_options(metasrv_write=True)
                with conn.begin():
                    return fn(conn)
        except sa_exc.SQLAlchemyError as exc:
            raise _translate(exc) from exc

    def _lock_revision(self, conn: Connection) -> int:
        """Lock the revision counter row for this transaction; return its value."""
        stmt = select(kv_revision_table.c.revision).where(kv_revision_table.c.id == 1)
        rev = conn.execute(stmt.with_for_update()).scalar_one_or_none()
        if rev is None:
            # Tables made by `metadata.create_all` (not the migration) lack the row.
            conn.execute(
                self._insert(kv_revision_table).values(id=1, revision=0).on_conflict_do_nothing()
            )
            rev = conn.execute(stmt.with_for_update()).scalar_one()
        return int(rev)

    def _bump_revision(self, conn: Connection, revision: int, *, deleted: bool = False) -> None:
        """The store's revision is now `revision`; `deleted`: this write removed a key
        (`deleted_revision`, which a watch reads instead of counting keys)."""
        values = {"revision": revision}
        if deleted:
            values["deleted_revision"] = revision
        conn.execute(update(kv_revision_table).where(kv_revision_table.c.id == 1).values(values))

    def _insert(self, table: Any) -> Any:
        return postgresql.insert(table) if self._dialect == "postgresql" else sqlite.insert(table)

    def _upsert(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        stmt = self._insert(kv_table)
        stmt = stmt.on_conflict_do_update(
            index_elements=[kv_table.c.key],
            set_={"value": stmt.excluded.value, "mod_revision": stmt.excluded.mod_revision},
        )
        conn.execute(stmt, rows)

    def _delete_keys(self, conn: Connection, keys: list[str]) -> int:
        removed = 0
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = keys[i : i + _IN_CHUNK]
            removed += conn.execute(delete(kv_table).where(kv_table.c.key.in_(chunk))).rowcount
        return removed

    def _current(self, conn: Connection, keys: list[str]) -> dict[str, tuple[bytes, int]]:
        found: dict[str, tuple[bytes, int]] = {}
        cols = (kv_table.c.key, kv_table.c.value, kv_table.c.mod_revision)
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = keys[i : i + _IN_CHUNK]
            for key, value, rev in conn.execute(select(*cols).where(kv_table.c.key.in_(chunk))):
                found[key] = (bytes(value), int(rev))
        return found

    def _prefixed(self, ops: Sequence[TxnOp]) -> list[TxnOp]:
        return [
            Put(self._full(op.key), op.value) if isinstance(op, Put) else Delete(self._full(op.key))
            for op in collapse_ops(ops)
        ]

    def _apply(self, conn: Connection, ops: Sequence[TxnOp], revision: int) -> bool:
        """Write `ops` at `revision`; True when a key was removed."""
        rows = [
            {"key": op.key, "value": op.value, "mod_revision": revision}
            for op in ops
            if isinstance(op, Put)
        ]
        deletes = [op.key for op in ops if isinstance(op, Delete)]
        if rows:
            self._upsert(conn, rows)
        return bool(deletes) and self._delete_keys(conn, deletes) > 0

    # --- KvBackend -------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        full = self._full(key)

        def do(conn: Connection) -> KeyValue | None:
            row = conn.execute(
                select(kv_table.c.value, kv_table.c.mod_revision).where(kv_table.c.key == full)
            ).first()
            return None if row is None else KeyValue(key, bytes(row[0]), int(row[1]))

        return self.run_in_transaction(do, write=False)

    def range(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> list[KeyValue]:
        if limit <= 0:
            return []
        cond = self._prefix_clause(prefix)
        if start_after is not None:
            cond = and_(cond, kv_table.c.key > self.key_prefix + start_after)
        stmt = (
            select(kv_table.c.key, kv_table.c.value, kv_table.c.mod_revision)
            .where(cond)
            .order_by(kv_table.c.key)
            .limit(limit)
        )

        def do(conn: Connection) -> list[KeyValue]:
            return [KeyValue(self._bare(k), bytes(v), int(r)) for k, v, r in conn.execute(stmt)]

        return self.run_in_transaction(do, write=False)

    def scan(self, prefix: str, *, page_size: int = 1000) -> Iterator[KeyValue]:
        return scan_pages(self.range, prefix, page_size)

    @contextmanager
    def snapshot(self) -> Iterator[Snapshot]:
        if self._closed:
            raise KvUnavailable("kv backend is closed")
        try:
            with self._mutex, self._engine.connect() as conn:
                if self._dialect == "postgresql":
                    # One snapshot for every statement of the transaction.
                    conn = conn.execution_options(
                        isolation_level="REPEATABLE READ", postgresql_readonly=True
                    )
                with conn.begin():
                    # The first read fixes what the transaction sees (PostgreSQL at its
                    # first statement, SQLite's WAL at its first read): the revision row.
                    stmt = select(kv_revision_table.c.revision).where(kv_revision_table.c.id == 1)
                    revision = int(conn.execute(stmt).scalar_one_or_none() or 0)
                    snap = SqlSnapshot(conn, self.key_prefix, revision, repr(self))
                    try:
                        yield snap
                    finally:
                        snap.close()
        except sa_exc.SQLAlchemyError as exc:
            raise snapshot_error(repr(self), exc) from exc

    def watch(
        self,
        prefix: str,
        after_revision: int,
        *,
        holds_after: Callable[[list[KvChange]], int],
        poll_interval: float = 0.5,
    ) -> KvWatch:
        return SqlWatch(
            functools.partial(self.run_in_transaction, write=False),
            self._prefix_clause(prefix),
            len(self.key_prefix),
            prefix,
            after_revision,
            holds_after=holds_after,
            poll_interval=poll_interval,
        )

    def put(self, key: str, value: bytes) -> int:
        return self.txn((), [Put(key, value)]).revision

    def delete(self, key: str) -> bool:
        full = self._full(key)

        def do(conn: Connection) -> bool:
            rev = self._lock_revision(conn)
            removed = self._delete_keys(conn, [full])
            if removed:
                self._bump_revision(conn, rev + 1, deleted=True)
            return removed > 0

        return self.run_in_transaction(do, write=True)

    def delete_prefix(self, prefix: str) -> int:
        cond = self._prefix_clause(prefix)

        def do(conn: Connection) -> int:
            rev = self._lock_revision(conn)
            removed = conn.execute(delete(kv_table).where(cond)).rowcount
            if removed:
                self._bump_revision(conn, rev + 1, deleted=True)
            return int(removed)

        return self.run_in_transaction(do, write=True)

    def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnOp],
        failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        check_txn_size("SQL", self.max_txn_ops, compares, success, failure)
        checks = [(self._full(c.key), c) for c in compares]
        branches = {True: self._prefixed(success), False: self._prefixed(failure)}

        def do(conn: Connection) -> TxnResult:
            rev = self._lock_revision(conn)
            current = self._current(conn, sorted({full for full, _ in checks}))
            ok = all(_holds(c, current.get(full)) for full, c in checks)
            ops = branches[ok]
            if ops:
                rev += 1
                deleted = self._apply(conn, ops, rev)
                self._bump_revision(conn, rev, deleted=deleted)
            return TxnResult(succeeded=ok, revision=rev)

        return self.run_in_transaction(do, write=True)

    def batch_put(self, items: Sequence[tuple[str, bytes]]) -> None:
        step = self.max_txn_ops
        for i in range(0, len(items), step):
            # Duplicate keys in one upsert statement are an error on PostgreSQL.
            chunk = {self._full(k): v for k, v in items[i : i + step]}

            def do(conn: Connection, chunk: dict[str, bytes] = chunk) -> None:
                rev = self._lock_revision(conn) + 1
                rows = [{"key": k, "value": v, "mod_revision": rev} for k, v in chunk.items()]
                self._upsert(conn, rows)
                self._bump_revision(conn, rev)

            self.run_in_transaction(do, write=True)

    def batch_update(
        self, items: Sequence[tuple[str, bytes]], fence: Sequence[Compare]
    ) -> BatchUpdate:
        fences = [(self._full(c.key), c) for c in fence]
        written: list[str] = []
        fenced = False
        step = self.max_txn_ops
        for i in range(0, len(items), step):
            chunk = {self._full(k): v for k, v in items[i : i + step]}

            def do(conn: Connection, chunk: dict[str, bytes] = chunk) -> list[str] | None:
                # Under the revision row's lock no other writer runs: what is read here
                # (the fence, which keys exist) holds until the upsert.
                rev = self._lock_revision(conn)
                current = self._current(conn, sorted({full for full, _ in fences}))
                if not all(_holds(c, current.get(full)) for full, c in fences):
                    return None
                present = self._present(conn, list(chunk))
                if present:
                    rows = [{"key": k, "value": chunk[k], "mod_revision": rev + 1} for k in present]
                    self._upsert(conn, rows)
                    self._bump_revision(conn, rev + 1)
                return present

            present = self.run_in_transaction(do, write=True)
            if present is None:
                fenced = True  # and every later chunk would be: the fence does not change
                break
            written.extend(self._bare(k) for k in present)
        return BatchUpdate(written, fenced)

    def _present(self, conn: Connection, keys: list[str]) -> list[str]:
        """Those of `keys` that exist."""
        if self._dialect == "postgresql":
            # One array parameter: one statement for the whole chunk.
            stmt = select(kv_table.c.key).where(kv_table.c.key == any_(_text_array(keys)))
            return list(conn.execute(stmt).scalars())
        found: list[str] = []
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = keys[i : i + _IN_CHUNK]
            found.extend(
                conn.execute(select(kv_table.c.key).where(kv_table.c.key.in_(chunk))).scalars()
            )
        return found

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    def revision(self) -> int:
        """Current store revision (0 before the first write)."""

        def do(conn: Connection) -> int:
            stmt = select(kv_revision_table.c.revision).where(kv_revision_table.c.id == 1)
            return int(conn.execute(stmt).scalar_one_or_none() or 0)

        return self.run_in_transaction(do, write=False)

    def __repr__(self) -> str:
        return f"SqlKv({make_url(self.url)!r}, key_prefix={self.key_prefix!r})"


def _text_array(keys: list[str]) -> Any:
    return bindparam("keys", keys, type_=postgresql.ARRAY(String))


def _holds(compare: Compare, current: tuple[bytes, int] | None) -> bool:
    if compare.value is not None:
        return current is not None and current[0] == compare.value
    return (0 if current is None else current[1]) == compare.revision
