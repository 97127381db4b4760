"""Leader election on etcd (DESIGN §4).

`EtcdElection` campaigns for the `__metasrv_election` key (under the kv key prefix) with a
create-if-absent transaction, binding the key to an etcd lease of `election.lease_secs`;
the term is the lease id. It runs on the lease thread (`_lease.py`): followers poll and
campaign when the lease is free (the leader resigned, or was killed and its lease
expired); a leader steps down as soon as a renewal fails for good, its lease is gone, or
it has not renewed for a whole TTL.

Leadership seen by a process can be stale (a paused process still believes it leads), so
every leader-only kv write carries `fence()`: a compare on the election key's value,
which embeds the term, so a deposed leader's writes fail in the store itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar, Unpack

from pyetcd import etcdrpc

from metasrv.election._lease import Attempt, LeaseElection, LeaseOptions
from metasrv.errors import KvUnavailable
from metasrv.keys import ELECTION_KEY
from metasrv.kv import EtcdKv, EtcdMembers, EtcdStubs, translate_etcd_error

logger = logging.getLogger(__name__)

T = TypeVar("T")


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
    def _call(self, fn: Callable[[EtcdStubs, float], T]) -> T:
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

        def renew(stubs: EtcdStubs, timeout: float) -> int:
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
