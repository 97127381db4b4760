"""Leader election: which metasrv process may purge, hand out instructions and write state.

Every backend elects one leader with a lease and fences its writes (DESIGN §4):

- `EtcdElection` (etcd kv) campaigns for the `__metasrv_election` key (under the kv key
  prefix) with a create-if-absent transaction, binding the key to an etcd lease of
  `election.lease_secs`; the term is the lease id.
- `SqlElection` (SQL kv, metasrv/sql_election.py) holds a lease row in
  `metasrv_election` (term, holder, expiry on the database's clock) and writes its term
  into the `__metasrv_election` kv key before it leads.

Both run on a dedicated thread with a connection of their own and a watchdog on
event-loop lag (metasrv/_lease_election.py). Followers poll and campaign when the lease
is free (the leader resigned, or was killed and its lease expired). A leader steps down
as soon as a renewal fails for good, its lease is gone, or it has not renewed for a
whole TTL.

Leadership seen by a process can be stale (a paused process still believes it leads),
so every leader-only kv write carries `fence()`: a compare on the election key's value,
which embeds the term, so a deposed leader's writes fail in the store itself.

`SingleLeader` is only for an in-memory SQLite kv (tests, tools): no other process can
reach that store, so the process is always the leader.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Protocol, TypeVar, Unpack, runtime_checkable

from pyetcd import etcdrpc
from sqlalchemy import make_url

from metasrv._lease_election import Attempt, LeaseElection, LeaseOptions, Listener, Listeners
from metasrv.errors import ConfigError, KvUnavailable
from metasrv.keys import ELECTION_KEY
from metasrv.kv import Compare, EtcdKv, KvBackend, SqlKv
from metasrv.kv._etcd import translate_etcd_error
from metasrv.kv._etcd_members import EtcdMembers, Stubs
from metasrv.settings import Settings
from metasrv.sql_election import SqlElection

logger = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = [
    "Election",
    "EtcdElection",
    "Listener",
    "SingleLeader",
    "SqlElection",
    "advertised_addr",
    "build_election",
]


@runtime_checkable
class Election(Protocol):
    """Who leads; built by `build_election`."""

    @property
    def is_leader(self) -> bool:
        """True while this process leads (and its lease is fresh)."""
        ...

    @property
    def term(self) -> int:
        """Term of the current leader as known here (etcd lease id); 0 when unknown."""
        ...

    async def start(self) -> None:
        """Begin campaigning (returns at once; leadership arrives via listeners)."""
        ...

    async def stop(self) -> None:
        """Resign (revoke the lease) and stop campaigning; safe to call twice."""
        ...

    def leader_addr(self) -> str | None:
        """HTTP address of the current leader (own address when leading), if known."""
        ...

    def add_listener(self, callback: Listener) -> None:
        """Call `callback(True)` on gaining and `callback(False)` on losing leadership."""
        ...

    def fence(self) -> list[Compare]:
        """Kv compares that hold only while this process is still the leader."""
        ...


def advertised_addr(settings: Settings) -> str:
    """The HTTP address other processes should use for this one (`host:port`):
    `http.advertise_addr`, else `http.addr`, whose wildcard host (which nobody can
    reach) is replaced by this host's name, with a warning to set `advertise_addr`."""
    if settings.http.advertise_addr:
        return settings.http.advertise_addr
    host, _, port = settings.http.addr.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
        logger.warning(
            "http.addr binds every interface and http.advertise_addr is unset: followers "
            "will name this process %s:%s; set http.advertise_addr to an address other "
            "processes and datanodes can reach",
            host,
            port,
        )
    return f"{host}:{port}"


def build_election(
    settings: Settings,
    kv: KvBackend,
    *,
    addr: str | None = None,
    loop_stalled_for: Callable[[], float] | None = None,
) -> Election:
    """`EtcdElection` on etcd, `SqlElection` on PostgreSQL, `SqliteFileLeader` on a
    SQLite file (one process per file), `SingleLeader` on an in-memory SQLite kv.
    `loop_stalled_for` (seconds since the event loop last ran) arms the leader's watchdog."""
    addr = addr or advertised_addr(settings)
    if isinstance(kv, EtcdKv):
        return EtcdElection(
            kv,
            node_name=settings.node_name,
            addr=addr,
            lease_secs=settings.election.lease_secs,
            loop_stalled_for=loop_stalled_for,
        )
    if isinstance(kv, SqlKv) and kv.url.startswith("sqlite"):
        if kv.in_memory:
            return SingleLeader(node_name=settings.node_name, addr=addr)
        return SqliteFileLeader(sqlite_path(kv.url), node_name=settings.node_name, addr=addr)
    if isinstance(kv, SqlKv):
        return SqlElection(
            kv.url,
            kv.key_prefix,
            node_name=settings.node_name,
            addr=addr,
            lease_secs=settings.election.lease_secs,
            loop_stalled_for=loop_stalled_for,
        )
    return SingleLeader(node_name=settings.node_name, addr=addr)


class SingleLeader:
    """Always the leader: for an in-memory SQLite kv, which no other process can reach
    (and, with its file lock, for a SQLite file: `SqliteFileLeader`)."""

    def __init__(self, *, node_name: str, addr: str) -> None:
        self.node_name = node_name
        self.addr = addr
        self._leader = False
        self._listeners = Listeners()

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def term(self) -> int:
        return 1 if self._leader else 0

    async def start(self) -> None:
        if self._leader:
            return
        self._listeners.start()
        self._leader = True
        logger.info("single-process leader (SQLite kv, no election)")
        self._listeners.notify(True)

    async def stop(self) -> None:
        if self._leader:
            self._leader = False
            self._listeners.notify(False)
        await self._listeners.drain_and_stop()

    def leader_addr(self) -> str | None:
        return self.addr if self._leader else None

    def add_listener(self, callback: Listener) -> None:
        self._listeners.add(callback)

    def fence(self) -> list[Compare]:
        # Nothing to fence against: no other process can reach this store.
        return []


def sqlite_path(url: str) -> Path:
    """The database file of a `sqlite:///...` URL."""
    database = make_url(url).database
    if not database:
        raise ConfigError(f"no SQLite file in {url!r}")
    return Path(database).resolve()


class SqliteFileLeader(SingleLeader):
    """The leader of a SQLite kv file, which one process serves: it holds an exclusive
    lock on `{file}.leader.lock` from `start` to `stop` (the kernel drops it when the
    process dies, even by SIGKILL), and a second process on the same file is refused.

    A lease row renewed through SQLite's single writer lock starved behind the daemon's
    own checkpoint batches when the process was saturated, and the busy single-node
    leader deposed itself (421/503 bursts); a file lock needs no writes to hold.
    Several metasrv processes need PostgreSQL or etcd."""

    def __init__(self, database: Path, *, node_name: str, addr: str) -> None:
        super().__init__(node_name=node_name, addr=addr)
        self.database = database
        self.lock_path = database.with_name(database.name + ".leader.lock")
        self._lock_file: IO[str] | None = None

    async def start(self) -> None:
        if self._lock_file is None:
            handle = open(self.lock_path, "a+")  # noqa: SIM115 (held until stop)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                handle.close()
                raise ConfigError(
                    f"the SQLite kv file {self.database} is in use by "
                    f"{holder}: a SQLite file serves one metasrv process; run several on "
                    "PostgreSQL or etcd (kv.backend, kv.sql_url)"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"metasrv pid {os.getpid()} ({self.node_name})\n")
            handle.flush()
            self._lock_file = handle
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        handle, self._lock_file = self._lock_file, None
        if handle is not None:
            handle.close()  # releases the lock


class EtcdElection(LeaseElection):
    """Lease-based election on etcd (see the module docstring); the term is the lease id.

    Its channel (its own, on the election thread) reaches every member in `kv.endpoints`
    and moves to another one as soon as the member in use fails: refused, reset, or
    silent for one call's deadline (lease/5: a paused or cut-off member). Every call the
    election makes may run twice, so each is retried at once on the next member: reads
    and keepalives are idempotent, a revoke of a revoked lease is a no-op, a granted
    lease nobody uses expires by itself, and the create transaction is re-evaluated (the
    key bound to our new lease, which only we know, means our first attempt won). The
    lease lives in the cluster, not in a member, so a keepalive through another member
    (or through a new etcd leader) keeps it, and with it our leadership.
    """

    def __init__(
        self,
        kv: EtcdKv,
        *,
        node_name: str,
        addr: str,
        **options: Unpack[LeaseOptions],
    ) -> None:
        super().__init__(node_name=node_name, addr=addr, **options)
        self._kv = kv
        self._key = (kv.key_prefix + ELECTION_KEY).encode()
        self._members: EtcdMembers | None = None  # this thread's own channels, opened by `start`
        # One member's deadline: lease/5, so a keepalive that meets a dead or frozen
        # member, and then a member that is still waiting for a new etcd leader, leaves
        # time for a third attempt within the lease (renewals start lease/3 after the last).
        self._attempt_timeout = max(0.5, self.lease_secs / 5)

    @property
    def member(self) -> str | None:
        """`host:port` of the etcd member the election's calls go to now (None before start)."""
        return None if self._members is None else self._members.current

    def move_to(self, member: str) -> None:
        """Send the election's calls to `member` from now on, until it fails (after start)."""
        assert self._members is not None, "the election has not started"
        self._members.move_to(member)

    def _open(self) -> None:
        if self._members is None:
            self._members = EtcdMembers(
                self._kv.endpoints, self._rpc_timeout, self._kv.security, name="election"
            )

    def _close(self) -> None:
        members, self._members = self._members, None
        if members is not None:
            members.close()

    def _read_holder(self) -> bytes | None:
        holder = self._read_key()
        return None if holder is None else holder[0]

    def _acquire(self) -> Attempt:
        # The lease's TTL runs from its grant, so our deadline counts from before it.
        granted = time.monotonic()
        lease_id = self._grant()
        value = self._value_for(lease_id)
        try:
            won, holder = self._try_create(value, lease_id)
        except BaseException:
            # The txn may still have landed; revoking the lease removes the key (or makes
            # the put fail), so no orphan key blocks the successor.
            self._revoke_quietly(lease_id)
            raise
        if not won:
            self._revoke_quietly(lease_id)
            return Attempt(won=False, value=b"" if holder is None else holder[0])
        return Attempt(won=True, term=lease_id, value=value, since=granted)

    def _renew_lease(self) -> str | None:
        sent = time.monotonic()
        ttl = self._keepalive(self._term)
        holder = self._read_key()
        if ttl <= 0:
            return "lease expired or revoked"
        if holder is None or holder[0] != self._value:
            return "election key no longer ours"
        self._deadline = sent + ttl
        return None

    def _release(self) -> None:
        # The lease carries the key: revoking it frees the key at once.
        self._revoke_quietly(self._term)

    # --- etcd calls (blocking, on the election thread) --------------------------------
    def _call(self, fn: Callable[[Stubs, float], T]) -> T:
        """`fn` on the member in use, moving to the next member on a connection failure
        (see the class docstring for why every election call may run twice), within
        two renewal deadlines (lease/3 each) in all."""
        members = self._members
        if members is None:
            raise KvUnavailable("the election's etcd channel is closed")
        try:
            return members.call(
                fn,
                attempt_timeout=self._attempt_timeout,
                budget=2 * self._rpc_timeout,
                idempotent=True,
            )
        except Exception as exc:
            if isinstance(exc, KvUnavailable):
                raise
            raise translate_etcd_error(exc) from exc

    def _read_key(self) -> tuple[bytes, int] | None:
        request = etcdrpc.RangeRequest(key=self._key)  # linearizable (not serializable)
        resp = self._call(lambda stubs, timeout: stubs.kv.Range(request, timeout))
        if not resp.kvs:
            return None
        return bytes(resp.kvs[0].value), int(resp.kvs[0].lease)

    def _grant(self) -> int:
        request = etcdrpc.LeaseGrantRequest(TTL=self.lease_secs)
        resp = self._call(lambda stubs, timeout: stubs.lease.LeaseGrant(request, timeout))
        return int(resp.ID)

    def _try_create(self, value: bytes, lease_id: int) -> tuple[bool, tuple[bytes, int] | None]:
        absent = etcdrpc.Compare(
            key=self._key,
            target=etcdrpc.Compare.VERSION,
            result=etcdrpc.Compare.EQUAL,
            version=0,
        )
        put = etcdrpc.RequestOp(
            request_put=etcdrpc.PutRequest(key=self._key, value=value, lease=lease_id)
        )
        get = etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=self._key))
        request = etcdrpc.TxnRequest(compare=[absent], success=[put], failure=[get])
        resp = self._call(lambda stubs, timeout: stubs.kv.Txn(request, timeout))
        if resp.succeeded:
            return True, None
        kvs = resp.responses[0].response_range.kvs if resp.responses else []
        holder = (bytes(kvs[0].value), int(kvs[0].lease)) if kvs else None
        # Bound to our new lease: an earlier attempt of this txn, cut off before its
        # answer reached us, created the key.
        return holder is not None and holder[1] == lease_id, holder

    def _keepalive(self, lease_id: int) -> int:
        """Renew the lease once; return its new TTL (<= 0: the lease is gone)."""
        request = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)

        def renew(stubs: Stubs, timeout: float) -> int:
            stream = stubs.lease.LeaseKeepAlive(iter([request]), timeout)
            try:
                for response in stream:
                    return int(response.TTL)
            finally:
                stream.cancel()
            return 0

        return self._call(renew)

    def _revoke_quietly(self, lease_id: int) -> None:
        if not lease_id:
            return
        request = etcdrpc.LeaseRevokeRequest(ID=lease_id)
        try:
            self._call(lambda stubs, timeout: stubs.lease.LeaseRevoke(request, timeout))
        except KvUnavailable as exc:
            # Expired, already revoked, or etcd down: the lease ends by itself anyway.
            logger.info("election: lease %x not revoked: %s", lease_id, exc)
