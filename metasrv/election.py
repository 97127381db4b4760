"""Leader election: which metasrv process may purge, hand out instructions and write state.

`EtcdElection` campaigns for the `__metasrv_election` key (under the kv key prefix) with
a create-if-absent transaction, binding the key to a lease of `election.lease_secs`.
Followers poll the key and campaign when it is gone (the leader resigned, or was killed
and its lease expired). A leader steps down as soon as a keepalive fails, its lease is
gone, the key no longer holds its value, or it has not renewed the lease for a whole TTL.

Leadership never waits behind work: campaigning and keepalives run on a thread of their
own, over a gRPC channel of their own, doing nothing but blocking etcd calls. A busy
event loop, a full default thread pool or a slow Kafka call cannot delay a renewal (a
busy loop holding the GIL yields it to this thread every few milliseconds). So that a
wedged process does not hold the cluster hostage either, a watchdog stops renewing (and
resigns) once the event loop has not run for `watchdog_secs` (3x the lease by default);
a process that is gone or frozen (SIGKILL, SIGSTOP) renews nothing and loses the lease.

Leadership seen by a process can be stale (a paused process still believes it leads),
so every leader-only kv write carries `fence()`: a compare on the election key's value,
which embeds the lease id, so a deposed leader's writes fail in the store itself.

`SingleLeader` is for the SQL backend without etcd: the process is always the leader.
Limitation: run only one metasrv process against one SQL kv database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from pyetcd import etcdrpc

from metasrv.errors import KvUnavailable
from metasrv.keys import ELECTION_KEY
from metasrv.kv import Compare, EtcdKv, KvBackend
from metasrv.kv._etcd import make_client, translate_etcd_error
from metasrv.settings import Settings

logger = logging.getLogger(__name__)

_RENEW_RETRY = 0.2
"""Seconds between retries of a keepalive that failed in transit."""

Listener = Callable[[bool], Awaitable[None]]
"""Called with True when this process gains leadership, False when it loses it."""


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
    """`EtcdElection` on an etcd kv backend, else `SingleLeader`. `loop_stalled_for`
    (seconds since the event loop last ran) arms the leader's watchdog."""
    addr = addr or advertised_addr(settings)
    if isinstance(kv, EtcdKv):
        return EtcdElection(
            kv,
            node_name=settings.node_name,
            addr=addr,
            lease_secs=settings.election.lease_secs,
            loop_stalled_for=loop_stalled_for,
        )
    return SingleLeader(node_name=settings.node_name, addr=addr)


class _Listeners:
    """Listener callbacks, run in order on a queue so slow ones never delay keepalives."""

    def __init__(self) -> None:
        self._callbacks: list[Listener] = []
        self._queue: asyncio.Queue[bool] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def add(self, callback: Listener) -> None:
        self._callbacks.append(callback)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="election-listeners")

    def notify(self, leader: bool) -> None:
        self._queue.put_nowait(leader)

    async def _run(self) -> None:
        while True:
            leader = await self._queue.get()
            await self._call_all(leader)
            self._queue.task_done()

    async def _call_all(self, leader: bool) -> None:
        for callback in list(self._callbacks):
            try:
                await callback(leader)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("election listener failed", extra={"leader": leader})

    async def drain_and_stop(self) -> None:
        """Deliver what is queued, then stop."""
        if self._task is None:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout=30)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None


class SingleLeader:
    """Always the leader: for one metasrv process on the SQL kv backend (no etcd)."""

    def __init__(self, *, node_name: str, addr: str) -> None:
        self.node_name = node_name
        self.addr = addr
        self._leader = False
        self._listeners = _Listeners()

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
        logger.info("single-process leader (SQL kv backend, no election)")
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
        # Nothing to fence against: no other process may share this store.
        return []


class EtcdElection:
    """Lease-based election on etcd, run on a dedicated thread (see the module docstring)."""

    def __init__(
        self,
        kv: EtcdKv,
        *,
        node_name: str,
        addr: str,
        lease_secs: int = 5,
        poll_interval: float = 0.5,
        loop_stalled_for: Callable[[], float] | None = None,
        watchdog_secs: float | None = None,
    ) -> None:
        self.node_name = node_name
        self.addr = addr
        self.lease_secs = lease_secs
        self.poll_interval = poll_interval
        self.watchdog_secs = 3.0 * lease_secs if watchdog_secs is None else watchdog_secs
        """Seconds without an event-loop tick after which the leader stops renewing."""
        self._loop_stalled_for = loop_stalled_for
        self._kv = kv
        self._key = (kv.key_prefix + ELECTION_KEY).encode()
        # Keepalive cadence: three renewals per TTL, each with a deadline short enough
        # that two failed renewals are noticed well before the lease could expire.
        self._renew_every = lease_secs / 3
        self._rpc_timeout = max(0.5, lease_secs / 3)
        self._client: Any = None  # this thread's own gRPC channel, opened by `start`
        self._listeners = _Listeners()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # Written by the election thread, read anywhere: each is one atomic attribute store.
        self._leader = False
        self._lease_id = 0
        self._value = b""
        self._deadline = 0.0  # monotonic time after which our lease may have expired
        self._leader_addr: str | None = None
        self._leader_term = 0

    # --- public API ------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leader and time.monotonic() < self._deadline

    @property
    def term(self) -> int:
        return self._lease_id if self._leader else self._leader_term

    def leader_addr(self) -> str | None:
        return self.addr if self.is_leader else self._leader_addr

    def add_listener(self, callback: Listener) -> None:
        self._listeners.add(callback)

    def fence(self) -> list[Compare]:
        # Our value embeds our lease id, so it matches only our own, current term;
        # before the first win it is a value no election key ever holds.
        return [Compare(ELECTION_KEY, value=self._value or b"\0not-leader")]

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._listeners.start()
        self._stopping.clear()
        if self._client is None:
            self._client = make_client(self._kv.endpoints, self._rpc_timeout)
        self._thread = threading.Thread(target=self._run, name="metasrv-election", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Resign (the thread revokes the lease on its way out) and stop campaigning."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        while thread is not None and thread.is_alive():
            # Its longest wait is one RPC deadline; polled, so no pool thread is needed.
            await asyncio.sleep(0.02)
        await self._listeners.drain_and_stop()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    # --- the election thread ------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    if self._campaign():
                        self._lead()
                    else:
                        self._stopping.wait(self.poll_interval)
                except Exception as exc:
                    # KvUnavailable mostly; keep campaigning once etcd answers again.
                    logger.warning("election: %s", exc)
                    if self._leader:
                        self._step_down(f"error: {exc}")
                    self._stopping.wait(self.poll_interval)
        finally:
            if self._leader:
                self._step_down("resigned")

    def _stalled(self) -> float | None:
        """Seconds the event loop has not run, when past the watchdog bound; else None."""
        if self._loop_stalled_for is None:
            return None
        stalled = self._loop_stalled_for()
        return stalled if stalled > self.watchdog_secs else None

    def _campaign(self) -> bool:
        """Observe the key; when it is free, try to take it. True when we won."""
        holder = self._guarded(self._read_key)
        if holder is not None:
            self._observe(holder)
            return False
        if self._stalled() is not None or self._stopping.is_set():
            return False  # a wedged (or stopping) process must not take over
        # The lease's TTL runs from its grant, so our deadline counts from before it.
        granted = time.monotonic()
        lease_id = self._guarded(self._grant)
        value = json.dumps(
            {"node": self.node_name, "addr": self.addr, "term": lease_id},
            separators=(",", ":"),
        ).encode()
        try:
            won, holder = self._guarded(self._try_create, value, lease_id)
        except BaseException:
            # The txn may still have landed; revoking the lease removes the key (or makes
            # the put fail), so no orphan key blocks the successor.
            self._revoke_quietly(lease_id)
            raise
        if not won:
            self._revoke_quietly(lease_id)
            if holder is not None:
                self._observe(holder)
            return False
        self._lease_id, self._value = lease_id, value
        self._deadline = granted + self.lease_secs
        self._leader_addr, self._leader_term = self.addr, lease_id
        self._leader = True
        logger.info(
            "elected leader", extra={"node": self.node_name, "term": lease_id, "addr": self.addr}
        )
        self._notify(True)
        return True

    def _lead(self) -> None:
        """Keep the lease alive and the key ours; return after stepping down or on stop.

        A renewal that fails in transit (timeout, connection reset) is retried while the
        lease may still be alive: one slow etcd answer must not cost the cluster its
        leader. `is_leader` turns False by itself at the deadline whatever happens here,
        and etcd expires the key (the write fence) at the same time.
        """
        wait = self._renew_every
        while self._leader and not self._stopping.wait(wait):
            try:
                reason = self._renew()
            except KvUnavailable as exc:
                if time.monotonic() < self._deadline:
                    logger.warning("election: keepalive failed, retrying: %s", exc)
                    wait = _RENEW_RETRY
                    continue
                reason = f"keepalive failed until the lease ran out: {exc}"
            wait = self._renew_every
            if reason is not None:
                self._step_down(reason)
                return

    def _renew(self) -> str | None:
        """One keepalive round: the reason to step down, or None. Raises `KvUnavailable`
        when etcd did not answer (the caller decides whether to retry)."""
        stalled = self._stalled()
        if stalled is not None:
            return f"event loop has not run for {stalled:.1f}s (watchdog {self.watchdog_secs:g}s)"
        sent = time.monotonic()
        ttl = self._guarded(self._keepalive, self._lease_id)
        holder = self._guarded(self._read_key)
        if ttl <= 0:
            return "lease expired or revoked"
        if holder is None or holder[0] != self._value:
            return "election key no longer ours"
        self._deadline = sent + ttl
        return None

    def _step_down(self, reason: str) -> None:
        if not self._leader:
            return
        self._leader = False
        self._deadline = 0.0
        self._leader_addr = None
        logger.warning(
            "leadership lost",
            extra={"node": self.node_name, "term": self._lease_id, "reason": reason},
        )
        self._notify(False)
        # Free the key at once (the lease carries it) so a successor need not wait the TTL.
        self._revoke_quietly(self._lease_id)

    def _notify(self, leader: bool) -> None:
        """Queue the listeners' call on the event loop (they are coroutines of the loop)."""
        self._call_soon(self._listeners.notify, leader)

    def _call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(fn, *args)

    def _observe(self, holder: tuple[bytes, int]) -> None:
        value, _lease = holder
        try:
            info: Any = json.loads(value)
            self._leader_addr = str(info["addr"])
            self._leader_term = int(info["term"])
        except (ValueError, KeyError, TypeError):
            logger.warning("election key holds an unreadable value: %r", value[:200])
            self._leader_addr, self._leader_term = None, 0

    # --- etcd calls (blocking, on the election thread) --------------------------------

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            if isinstance(exc, KvUnavailable):
                raise
            raise translate_etcd_error(exc) from exc

    def _read_key(self) -> tuple[bytes, int] | None:
        resp = self._client.kvstub.Range(etcdrpc.RangeRequest(key=self._key), self._rpc_timeout)
        if not resp.kvs:
            return None
        return bytes(resp.kvs[0].value), int(resp.kvs[0].lease)

    def _grant(self) -> int:
        resp = self._client.leasestub.LeaseGrant(
            etcdrpc.LeaseGrantRequest(TTL=self.lease_secs), self._rpc_timeout
        )
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
        resp = self._client.kvstub.Txn(
            etcdrpc.TxnRequest(compare=[absent], success=[put], failure=[get]),
            self._rpc_timeout,
        )
        if resp.succeeded:
            return True, None
        kvs = resp.responses[0].response_range.kvs if resp.responses else []
        return False, ((bytes(kvs[0].value), int(kvs[0].lease)) if kvs else None)

    def _keepalive(self, lease_id: int) -> int:
        """Renew the lease once; return its new TTL (<= 0: the lease is gone)."""
        request = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)
        stream = self._client.leasestub.LeaseKeepAlive(iter([request]), self._rpc_timeout)
        try:
            for response in stream:
                return int(response.TTL)
        finally:
            stream.cancel()
        return 0

    def _revoke_quietly(self, lease_id: int) -> None:
        if not lease_id:
            return
        try:
            self._guarded(self._revoke, lease_id)
        except KvUnavailable as exc:
            # Expired, already revoked, or etcd down: the lease ends by itself anyway.
            logger.info("election: lease %x not revoked: %s", lease_id, exc)

    def _revoke(self, lease_id: int) -> None:
        self._client.leasestub.LeaseRevoke(
            etcdrpc.LeaseRevokeRequest(ID=lease_id), self._rpc_timeout
        )
