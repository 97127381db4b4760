"""The etcd kv backend (etcd v3 gRPC API through `pyetcd`, the python-etcd3 fork).

Requests are built as etcd protobuf messages directly, so range reads can use etcd's
limit without sorting (etcd drops the limit and sorts everything when a sort order is
given) and `batch_put` can keep several transactions in flight, which lets etcd
commit them in one raft round and one fsync.

`endpoints` lists every member of the cluster. Calls go to one member and move to
another when it fails (metasrv/kv/_etcd_members.py): a read is retried on the next
member at once, a write only when it provably never left this process (see `txn`).
Every read is linearizable (etcd's default: no request sets `serializable`), so a member
cut off from the quorum cannot answer with a stale marker, route or election key: its
read waits for a quorum it cannot reach and times out, and the read moves on.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import grpc
from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exc

from metasrv.errors import InvalidArgument, KvUnavailable, MetasrvError, TxnTooLarge
from metasrv.kv._common import check_txn_size, collapse_ops, prefix_range_end, scan_pages
from metasrv.kv._etcd_members import EtcdMembers, Stubs, is_connection_failure, never_sent
from metasrv.kv._etcd_security import EtcdSecurity
from metasrv.kv._etcd_watch import EtcdWatch
from metasrv.kv._protocol import (
    BatchUpdate,
    Compare,
    KeyPage,
    KeyValue,
    KvChange,
    KvWatch,
    Put,
    Snapshot,
    TxnOp,
    TxnResult,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

ETCD_MAX_TXN_OPS = 128
"""etcd's default `--max-txn-ops`."""

_BATCH_BYTES = 1 << 20
"""Payload bytes per batch_put transaction, below etcd's 1.5 MiB `--max-request-bytes`."""

READ_ATTEMPT_SECS = 1.0
"""Longest wait for one member's answer to a read while other members are left to ask: a
healthy member answers a 1,000-key page in milliseconds, even on a loaded machine."""

_BATCH_IN_FLIGHT = 16
"""batch_put transactions sent before waiting for the oldest one."""

# One table for translating etcd client errors. pyetcd turns some gRPC status codes into
# its own exceptions and re-raises the rest as grpc.RpcError.
_CLIENT_ERRORS: tuple[tuple[type[Exception], str], ...] = (
    (etcd_exc.ConnectionFailedError, "etcd unreachable"),
    (etcd_exc.ConnectionTimeoutError, "etcd request timed out"),
    (etcd_exc.NoServerAvailableError, "no etcd endpoint available"),
    (etcd_exc.InternalServerError, "etcd internal error"),
    (etcd_exc.PreconditionFailedError, "etcd refused the request"),
    (etcd_exc.Etcd3Exception, "etcd error"),
)
_STATUS_ERRORS: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.UNAVAILABLE: "etcd unreachable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "etcd request timed out",
    grpc.StatusCode.CANCELLED: "etcd request cancelled",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "etcd overloaded",
    grpc.StatusCode.INTERNAL: "etcd internal error",
    grpc.StatusCode.UNKNOWN: "etcd error",
    grpc.StatusCode.UNAUTHENTICATED: "etcd rejected our credentials",
    grpc.StatusCode.PERMISSION_DENIED: "etcd denied access",
    grpc.StatusCode.FAILED_PRECONDITION: "etcd refused the request",
    grpc.StatusCode.NOT_FOUND: "etcd: not found",
    grpc.StatusCode.INVALID_ARGUMENT: "etcd rejected the request",
}
# INVALID_ARGUMENT details that mean "split the transaction".
_TOO_LARGE_MARKERS = ("too many operations", "request is too large")


def translate_etcd_error(exc: Exception) -> MetasrvError:
    """Map a pyetcd / gRPC exception to `KvUnavailable` or `TxnTooLarge`."""
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if callable(getattr(exc, "code", None)) else None
        details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
        details = details or ""
        if code == grpc.StatusCode.INVALID_ARGUMENT and any(
            m in details for m in _TOO_LARGE_MARKERS
        ):
            return TxnTooLarge(f"etcd refused the transaction: {details}")
        prefix = _STATUS_ERRORS.get(code, "etcd error") if code is not None else "etcd error"
        name = code.name if code is not None else type(exc).__name__
        return KvUnavailable(f"{prefix} ({name}): {details}")
    for cls, message in _CLIENT_ERRORS:
        if isinstance(exc, cls):
            return KvUnavailable(f"{message}: {exc}")
    if isinstance(exc, ValueError) and "failed node" in str(exc):
        return KvUnavailable("etcd endpoint marked failed")
    raise exc


class _Chunk(NamedTuple):
    """One batch transaction's keys (with the key prefix) and their put operations."""

    keys: list[bytes]
    puts: list[Any]


def _exists(key: bytes) -> Any:
    """The compare "`key` exists" (its version, 0 for an absent key, is above 0)."""
    return etcdrpc.Compare(
        key=key, result=etcdrpc.Compare.GREATER, target=etcdrpc.Compare.VERSION, version=0
    )


def _holds(compare: Compare, kvs: Any) -> bool:
    """Whether `compare` holds for a key a range read answered with `kvs` (0 or 1 key)."""
    if compare.value is not None:
        return len(kvs) > 0 and bytes(kvs[0].value) == compare.value
    return (int(kvs[0].mod_revision) if len(kvs) else 0) == compare.revision


class _Unsent(Exception):
    """Why a member was left: batch_put transactions could not reach it."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} batch_put transactions reached no connection")


class EtcdKv:
    """`KvBackend` on etcd v3. `endpoints`: "host:port" strings."""

    max_txn_ops: int = ETCD_MAX_TXN_OPS

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        key_prefix: str = "",
        *,
        timeout: float = 5.0,
        security: EtcdSecurity | None = None,
    ) -> None:
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not self.endpoints:
            raise InvalidArgument("EtcdKv needs at least one endpoint")
        self.key_prefix = key_prefix
        self.timeout = timeout
        self.read_attempt_timeout = min(timeout / 2, READ_ATTEMPT_SECS)
        """Seconds a read waits for one member before it moves to the next."""
        self._prefix = key_prefix.encode()
        self.security = security or EtcdSecurity()
        """TLS and credentials; the election opens its own channel with the same."""
        self._members = EtcdMembers(self.endpoints, timeout, self.security)
        self._closed = False

    @property
    def client(self) -> Any:
        """The raw pyetcd client, on the member in use (its stubs follow that member)."""
        self._members.pick()
        return self._members.client

    @property
    def member(self) -> str:
        """`host:port` of the etcd member calls go to now."""
        return self._members.current

    def move_to(self, member: str) -> None:
        """Send calls to `member` (one of `endpoints`) from now on, until it fails."""
        self._members.move_to(member)

    # --- helpers ---------------------------------------------------------------------

    def _full(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def _bare(self, key: bytes) -> str:
        return key[len(self._prefix) :].decode()

    def _read(self, method: str, request: Any) -> Any:
        """A read: retried on the next member after any connection-level failure. A member
        that does not answer (paused, cut off) costs `read_attempt_timeout` before the
        read moves on; the last member gets what is left of the timeout."""
        return self._rpc(
            method, request, attempt_timeout=self.read_attempt_timeout, idempotent=True
        )

    def _write(self, method: str, request: Any) -> Any:
        """A write: retried on the next member only when it never left this process."""
        return self._rpc(method, request, attempt_timeout=self.timeout, idempotent=False)

    def _rpc(self, method: str, request: Any, *, attempt_timeout: float, idempotent: bool) -> Any:
        def send(stubs: Stubs, timeout: float) -> Any:
            return getattr(stubs.kv, method)(request, timeout)

        return self._guard(
            lambda: self._members.call(
                send,
                attempt_timeout=attempt_timeout,
                budget=self.timeout,
                idempotent=idempotent,
                last_waits=True,
            )
        )

    def _guard(self, fn: Callable[[], _T]) -> _T:
        if self._closed:
            raise KvUnavailable("kv backend is closed")
        try:
            return fn()
        except (grpc.RpcError, etcd_exc.Etcd3Exception, ValueError) as exc:
            raise translate_etcd_error(exc) from exc

    def _compare(self, c: Compare) -> Any:
        msg = etcdrpc.Compare(key=self._full(c.key), result=etcdrpc.Compare.EQUAL)
        if c.value is not None:
            msg.target = etcdrpc.Compare.VALUE
            msg.value = c.value
        elif c.revision == 0:
            # version 0 <=> the key does not exist
            msg.target = etcdrpc.Compare.VERSION
            msg.version = 0
        else:
            msg.target = etcdrpc.Compare.MOD
            msg.mod_revision = int(c.revision or 0)
        return msg

    def _op(self, op: TxnOp) -> Any:
        if isinstance(op, Put):
            return etcdrpc.RequestOp(
                request_put=etcdrpc.PutRequest(key=self._full(op.key), value=op.value)
            )
        return etcdrpc.RequestOp(
            request_delete_range=etcdrpc.DeleteRangeRequest(key=self._full(op.key))
        )

    def _range_request(self, lo: bytes, hi: bytes, limit: int) -> Any:
        # No sort order: etcd returns keys in key order and applies the limit in its index.
        return etcdrpc.RangeRequest(key=lo or b"\0", range_end=hi, limit=limit)

    # --- KvBackend -------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        resp = self._read("Range", etcdrpc.RangeRequest(key=self._full(key)))
        if not resp.kvs:
            return None
        kv = resp.kvs[0]
        return KeyValue(key, bytes(kv.value), int(kv.mod_revision))

    def range(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> list[KeyValue]:
        if limit <= 0:
            return []
        lo = self._full(prefix)
        hi = prefix_range_end(lo)
        if start_after is not None:
            # The smallest key greater than start_after.
            lo = max(lo, self._full(start_after) + b"\0")
        resp = self._read("Range", self._range_request(lo, hi, limit))
        return [
            KeyValue(self._bare(kv.key), bytes(kv.value), int(kv.mod_revision)) for kv in resp.kvs
        ]

    def scan(self, prefix: str, *, page_size: int = 1000) -> Iterator[KeyValue]:
        return scan_pages(self.range, prefix, page_size)

    @contextmanager
    def snapshot(self) -> Iterator[Snapshot]:
        # The revision is the header of a linearizable read; later ranges ask for it.
        probe = etcdrpc.RangeRequest(key=self._prefix or b"\0", limit=1)
        snap = _EtcdSnapshot(self, int(self._snapshot_read(probe, None).header.revision))
        try:
            yield snap
        finally:
            snap.open = False

    def _snapshot_read(self, request: Any, revision: int | None) -> Any:
        """A snapshot's range, its errors naming the members (a batch job shows them)."""
        try:
            return self._read("Range", request)
        except KvUnavailable as exc:
            if "compacted" in exc.message:
                raise KvUnavailable(
                    f"etcd compacted revision {revision} while a snapshot was read at it "
                    f"({exc.message}); take the snapshot again"
                ) from exc
            raise KvUnavailable(
                f"etcd at {', '.join(self.endpoints)} unreachable: {exc.message}"
            ) from exc

    def watch(
        self, prefix: str, after_revision: int, *, holds_after: Callable[[list[KvChange]], int]
    ) -> KvWatch:
        # etcd reports deletes itself: `holds_after` is for backends that cannot.
        return EtcdWatch(
            self.endpoints, self.timeout, self.security, self.key_prefix, prefix, after_revision
        )

    def put(self, key: str, value: bytes) -> int:
        resp = self._write("Put", etcdrpc.PutRequest(key=self._full(key), value=value))
        return int(resp.header.revision)

    def delete(self, key: str) -> bool:
        resp = self._write("DeleteRange", etcdrpc.DeleteRangeRequest(key=self._full(key)))
        return int(resp.deleted) > 0

    def delete_prefix(self, prefix: str) -> int:
        lo = self._full(prefix)
        req = etcdrpc.DeleteRangeRequest(key=lo or b"\0", range_end=prefix_range_end(lo))
        return int(self._write("DeleteRange", req).deleted)

    def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnOp],
        failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        check_txn_size("etcd", self.max_txn_ops, compares, success, failure)
        req = etcdrpc.TxnRequest(
            compare=[self._compare(c) for c in compares],
            success=[self._op(op) for op in collapse_ops(success)],
            failure=[self._op(op) for op in collapse_ops(failure)],
        )
        # Not replayed once it may have reached a member (a reset connection, a deadline):
        # our transactions are compare-and-swaps (the leader's fence, a key's revision,
        # "absent"), and one that did apply would fail its own compare when replayed (the
        # revision moved, the key now exists), answering "lost" for a write that won; a
        # fence-only one would be re-applied later than, and over, a newer write of ours
        # to the same keys. A caller that gets KvUnavailable re-reads before it retries.
        # A txn that never reached a member (no connection) is safely sent to the next.
        resp = self._write("Txn", req)
        return TxnResult(succeeded=bool(resp.succeeded), revision=int(resp.header.revision))

    def batch_put(self, items: Sequence[tuple[str, bytes]]) -> None:
        # Deduplicate first so chunks touch disjoint keys and may commit in any order.
        chunks = list(self._chunks(dict(items), self.max_txn_ops))
        self._send_all(chunks, lambda chunk: etcdrpc.TxnRequest(success=chunk.puts))

    def batch_update(
        self, items: Sequence[tuple[str, bytes]], fence: Sequence[Compare]
    ) -> BatchUpdate:
        # One transaction per chunk: the fence and "the key exists" (version > 0) for each
        # key as compares, the puts as success; the failure branch reads the fence keys
        # and the chunk's keys, so a failed chunk says, atomically with its compares,
        # whether the fence broke (nothing more to write) or a key was deleted (the rest
        # is sent again). Same chunks in flight as `batch_put`: the steady state costs
        # one compare per key more, and nothing else.
        fences = [self._compare(c) for c in fence]
        fence_reads = [self._range_op(c.key, keys_only=False) for c in fence]
        room = self.max_txn_ops - len(fence)
        if room <= 0:
            raise TxnTooLarge(f"a fence of {len(fence)} compares leaves no room for a key")

        def request(chunk: _Chunk) -> Any:
            return etcdrpc.TxnRequest(
                compare=[*fences, *(_exists(key) for key in chunk.keys)],
                success=chunk.puts,
                failure=[*fence_reads, *(self._range_op(key) for key in chunk.keys)],
            )

        written: list[str] = []
        fenced = False
        todo = list(self._chunks(dict(items), room))
        while todo:
            again: list[_Chunk] = []
            for chunk, resp in self._send_all(todo, request):
                if resp.succeeded:
                    written.extend(self._bare(key) for key in chunk.keys)
                    continue
                answers = [r.response_range.kvs for r in resp.responses]
                held = [answers[i] for i in range(len(fence))]
                if not all(_holds(c, kvs) for c, kvs in zip(fence, held, strict=True)):
                    fenced = True
                    continue
                present = [i for i, kvs in enumerate(answers[len(fence) :]) if len(kvs) > 0]
                if present:
                    again.append(
                        _Chunk([chunk.keys[i] for i in present], [chunk.puts[i] for i in present])
                    )
            todo = again
        return BatchUpdate(written, fenced)

    def _range_op(self, key: str | bytes, *, keys_only: bool = True) -> Any:
        full = key if isinstance(key, bytes) else self._full(key)
        return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=full, keys_only=keys_only))

    def _send_all(
        self, chunks: list[_Chunk], request: Callable[[_Chunk], Any]
    ) -> list[tuple[_Chunk, Any]]:
        """Send each chunk as the transaction `request(chunk)`; return every chunk with
        its response. A chunk that reached no member goes to the next one; any other
        failure raises (its outcome unknown)."""
        if self._closed:
            raise KvUnavailable("kv backend is closed")
        answered: list[tuple[_Chunk, Any]] = []
        for _ in self.endpoints:  # one round per member at most
            stubs = self._members.pick()
            try:
                chunks = self._send_chunks(stubs, chunks, request, answered)
            except (grpc.RpcError, etcd_exc.Etcd3Exception, ValueError) as exc:
                if is_connection_failure(exc):
                    self._members.fail(stubs.member, exc)
                raise translate_etcd_error(exc) from exc
            if not chunks:
                return answered
            # What is left never reached a member: send it to the next one.
            self._members.fail(stubs.member, _Unsent(len(chunks)))
        raise KvUnavailable(f"etcd unreachable: {len(chunks)} batch transactions not sent")

    def _send_chunks(
        self,
        stubs: Stubs,
        chunks: list[_Chunk],
        request: Callable[[_Chunk], Any],
        answered: list[tuple[_Chunk, Any]],
    ) -> list[_Chunk]:
        """Send each chunk as one transaction, `_BATCH_IN_FLIGHT` at a time, appending
        each answered one to `answered`; return the chunks that reached no member, raise
        on any other failure (its outcome unknown: a put-only chunk carries no compare to
        re-evaluate, and a fenced one may have applied, so neither is replayed)."""
        unsent: list[_Chunk] = []
        pending: deque[tuple[_Chunk, Any]] = deque()

        def settle() -> None:
            chunk, future = pending.popleft()
            try:
                answered.append((chunk, future.result()))
            except grpc.RpcError as exc:
                if not never_sent(exc):
                    raise
                unsent.append(chunk)

        try:
            for chunk in chunks:
                pending.append((chunk, stubs.kv.Txn.future(request(chunk), self.timeout)))
                if len(pending) >= _BATCH_IN_FLIGHT:
                    settle()
            while pending:
                settle()
        finally:
            for _, future in pending:
                future.cancel()
        return unsent

    def _chunks(self, items: dict[str, bytes], per_chunk: int) -> Iterator[_Chunk]:
        chunk = _Chunk([], [])
        size = 0
        for key, value in items.items():
            full = self._full(key)
            if chunk.keys and (
                len(chunk.keys) >= per_chunk or size + len(full) + len(value) > _BATCH_BYTES
            ):
                yield chunk
                chunk, size = _Chunk([], []), 0
            chunk.keys.append(full)
            chunk.puts.append(
                etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=full, value=value))
            )
            size += len(full) + len(value)
        if chunk.keys:
            yield chunk

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._members.close()

    def __repr__(self) -> str:
        return f"EtcdKv({self.endpoints!r}, key_prefix={self.key_prefix!r})"


class _EtcdSnapshot:
    """`Snapshot` on etcd: ranges at one fixed revision, paged with etcd's limit."""

    def __init__(self, kv: EtcdKv, revision: int) -> None:
        self._kv = kv
        self._revision = revision
        self.open = True

    @property
    def revision(self) -> int:
        return self._revision

    def pages(self, prefix: str, *, page_size: int = 1000) -> Iterator[KeyPage]:
        if page_size <= 0:
            raise InvalidArgument(f"page_size must be positive, got {page_size}")
        kv = self._kv
        lo = kv._full(prefix)
        return self._pages(lo, prefix_range_end(lo), page_size)

    def _pages(self, lo: bytes, hi: bytes, page_size: int) -> Iterator[KeyPage]:
        cut = len(self._kv._prefix)
        while True:
            if not self.open:
                raise KvUnavailable("kv snapshot read after its `with` block ended")
            request = self._kv._range_request(lo, hi, page_size)
            request.revision = self._revision
            resp = self._kv._snapshot_read(request, self._revision)
            items = resp.kvs
            if items:
                # errors="replace": a key another tool wrote in another encoding still
                # reaches the caller, which decides whether it is malformed.
                yield KeyPage(
                    [i.key[cut:].decode(errors="replace") for i in items],
                    [i.value for i in items],
                )
            if not resp.more or not items:
                return
            lo = bytes(items[-1].key) + b"\0"
