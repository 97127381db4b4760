"""Leader election on the SQL kv backend (PostgreSQL, or SQLite on one host): a lease row.

One row of `metasrv_election` per kv key prefix holds the leader's lease: `term`,
`holder`, `value` and `expires_at`, epoch seconds on the database's own clock (so the
hosts' clocks never matter). A process takes the lease when the row is missing or
expired, in one transaction that locks the row (`SELECT ... FOR UPDATE` on PostgreSQL,
`BEGIN IMMEDIATE` on SQLite) and raises the term by one; it renews with an `UPDATE`
that only matches its own term while the lease lives, three times per TTL, on the
thread of `LeaseElection` with an engine of its own whose connects, lock waits and
statements are bounded (a stuck database cannot hold the thread past the lease).

Fencing: before it leads, the winner writes its value (which names the new term) into
the `__metasrv_election` kv key with a compare-and-swap, and every leader-only kv write
compares that key's value (`fence`), as on etcd. A deposed leader's writes therefore
fail in the store as soon as a successor has won; until then nobody else writes. The
kv key is never deleted (the next winner overwrites it), so terms only grow.

SQLite: processes on one host sharing the file elect the same way (the file's lock
serializes their transactions).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar, Unpack

import sqlalchemy.exc as sa_exc
from sqlalchemy import ColumnElement, Float, and_, cast, func, insert, literal, select, update
from sqlalchemy.engine import Connection

from metasrv.election._lease import Attempt, LeaseElection, LeaseOptions
from metasrv.errors import KvUnavailable
from metasrv.keys import ELECTION_KEY, decode_election
from metasrv.kv import Compare, Put, SqlKv
from metasrv.sql import election_table

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_UNIX_EPOCH_JULIAN_DAY = 2440587.5


def db_clock(dialect: str) -> ColumnElement[float]:
    """The database's current time in epoch seconds (wall clock at the statement)."""
    if dialect == "postgresql":
        # clock_timestamp(), not now(): now() is frozen at the transaction's start.
        return cast(func.extract("epoch", func.clock_timestamp()), Float)
    return cast((func.julianday("now") - _UNIX_EPOCH_JULIAN_DAY) * 86400.0, Float)


class SqlElection(LeaseElection):
    """Lease-row election on the SQL kv database at `url` (see the module docstring)."""

    def __init__(
        self,
        url: str,
        key_prefix: str = "",
        *,
        node_name: str,
        addr: str,
        **options: Unpack[LeaseOptions],
    ) -> None:
        super().__init__(node_name=node_name, addr=addr, **options)
        self.url = url
        self.key_prefix = key_prefix
        self._name = key_prefix + ELECTION_KEY
        self._kv: SqlKv | None = None  # this thread's own engine, opened by `start`

    # --- LeaseElection store calls --------------------------------------------------

    def _open(self) -> None:
        if self._kv is None:
            self._kv = SqlKv(self.url, self.key_prefix, timeout=self._rpc_timeout)

    def _close(self) -> None:
        kv, self._kv = self._kv, None
        if kv is not None:
            kv.close()

    def _read_holder(self) -> bytes | None:
        def do(conn: Connection) -> bytes | None:
            now = db_clock(conn.dialect.name)
            stmt = select(election_table.c.value).where(
                and_(election_table.c.name == self._name, election_table.c.expires_at > now)
            )
            value = conn.execute(stmt).scalar_one_or_none()
            return None if value is None else bytes(value)

        return self._tx(do, write=False)

    def _acquire(self) -> Attempt:
        since = time.monotonic()
        attempt = self._tx(self._take_lease, write=True)
        if not attempt.won:
            return attempt
        try:
            fenced = self._write_fence_key(attempt.value)
        except BaseException:
            self._release_term(attempt.term)
            raise
        if not fenced:
            # A later term wrote the key meanwhile: ours is already over.
            self._release_term(attempt.term)
            return Attempt(won=False)
        return Attempt(won=True, term=attempt.term, value=attempt.value, since=since)

    def _renew_lease(self) -> str | None:
        sent = time.monotonic()
        term = self._term

        def do(conn: Connection) -> int:
            now = db_clock(conn.dialect.name)
            stmt = (
                update(election_table)
                .where(
                    and_(
                        election_table.c.name == self._name,
                        election_table.c.term == term,
                        election_table.c.expires_at > now,
                    )
                )
                .values(expires_at=now + literal(float(self.lease_secs)))
            )
            return int(conn.execute(stmt).rowcount)

        if self._tx(do, write=True) != 1:
            return "lease expired or taken over"
        self._deadline = sent + self.lease_secs
        return None

    def _release(self) -> None:
        self._release_term(self._term)

    # --- helpers (blocking, on the election thread) -----------------------------------

    def _tx(self, fn: Callable[[Connection], _T], *, write: bool) -> _T:
        if self._kv is None:
            raise KvUnavailable("election is not started")
        return self._kv.run_in_transaction(fn, write=write)

    def _take_lease(self, conn: Connection) -> Attempt:
        """One transaction: the row's holder while its lease lives, else the lease, ours."""
        now = db_clock(conn.dialect.name)
        t = election_table.c
        row = conn.execute(
            select(t.term, t.value, t.expires_at > now)
            .where(t.name == self._name)
            .with_for_update()
        ).first()
        if row is not None and row[2]:
            return Attempt(won=False, value=bytes(row[1]))
        term = (0 if row is None else int(row[0])) + 1
        value = self._value_for(term)
        lease = {
            "term": term,
            "holder": self.node_name[:255],
            "value": value,
            "expires_at": now + literal(float(self.lease_secs)),
        }
        if row is None:
            # A concurrent first insert wins the primary key; ours then fails and loses.
            try:
                with conn.begin_nested():
                    conn.execute(insert(election_table).values(name=self._name, **lease))
            except sa_exc.IntegrityError:
                return Attempt(won=False)
        else:
            conn.execute(update(election_table).where(t.name == self._name).values(**lease))
        return Attempt(won=True, term=term, value=value)

    def _write_fence_key(self, value: bytes) -> bool:
        """Compare-and-swap our value into the election kv key; False when it moved."""
        assert self._kv is not None
        current = self._kv.get(ELECTION_KEY)
        if current is not None and _term_of(current.value) >= _term_of(value):
            return False
        expected = 0 if current is None else current.mod_revision
        guard = [Compare(ELECTION_KEY, revision=expected)]
        return self._kv.txn(guard, [Put(ELECTION_KEY, value)]).succeeded

    def _release_term(self, term: int) -> None:
        """End lease `term` now, if it is still the row's (quietly: it expires anyway)."""
        if not term:
            return

        def do(conn: Connection) -> None:
            conn.execute(
                update(election_table)
                .where(and_(election_table.c.name == self._name, election_table.c.term == term))
                .values(expires_at=0.0)
            )

        try:
            self._tx(do, write=True)
        except KvUnavailable as exc:
            logger.info("election: lease of term %d not released: %s", term, exc)


def _term_of(value: bytes) -> int:
    """The term named by an election value; 0 when unreadable (a value of another tool)."""
    try:
        return decode_election(value).term
    except ValueError:
        return 0
