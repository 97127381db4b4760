"""The etcd kv backend (etcd v3 gRPC API through `pyetcd`, the python-etcd3 fork).

Requests are built as etcd protobuf messages directly, so range reads can use etcd's
limit without sorting (etcd drops the limit and sorts everything when a sort order is
given) and `batch_put` can keep several transactions in flight, which lets etcd
commit them in one raft round and one fsync.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import pyetcd
from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exc

from metasrv.errors import InvalidArgument, KvUnavailable, MetasrvError, TxnTooLarge
from metasrv.kv._common import check_txn_size, collapse_ops, prefix_range_end, scan_pages
from metasrv.kv._etcd_security import EtcdSecurity
from metasrv.kv._protocol import Compare, KeyValue, Put, TxnOp, TxnResult

logger = logging.getLogger(__name__)

ETCD_MAX_TXN_OPS = 128
"""etcd's default `--max-txn-ops`."""

_BATCH_BYTES = 1 << 20
"""Payload bytes per batch_put transaction, below etcd's 1.5 MiB `--max-request-bytes`."""

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


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """'host:port' (optionally with http://) -> (host, port)."""
    rest = endpoint.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgument(f"etcd endpoint must be host:port, got {endpoint!r}")
    return host.strip("[]"), int(port)


def make_client(
    endpoints: Sequence[str], timeout: float, security: EtcdSecurity | None = None
) -> Any:
    """A pyetcd client failing over between `endpoints`; plain-text gRPC unless
    `security` asks for TLS and/or a user."""
    security = security or EtcdSecurity()
    creds = security.channel_credentials()
    # pyetcd marks an endpoint failed for `time_retry` seconds after one error and
    # refuses to use it meanwhile; with a single endpoint that would turn a brief etcd
    # restart into minutes of errors, so retry it at once.
    time_retry = 0.0 if len(endpoints) == 1 else 2.0
    eps = [
        pyetcd.Endpoint(host, port, secure=creds is not None, creds=creds, time_retry=time_retry)
        for host, port in map(parse_endpoint, endpoints)
    ]
    for ep in eps:
        ep.channel = security.secure(ep.channel, timeout)
    return pyetcd.MultiEndpointEtcd3Client(endpoints=eps, timeout=timeout, failover=True)


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
        self._prefix = key_prefix.encode()
        self.security = security or EtcdSecurity()
        """TLS and credentials; the election opens its own channel with the same."""
        self._client: Any = make_client(self.endpoints, timeout, self.security)
        self._closed = False

    @property
    def client(self) -> Any:
        """The raw pyetcd client (leases and watches for the election)."""
        return self._client

    # --- helpers ---------------------------------------------------------------------

    def _full(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def _bare(self, key: bytes) -> str:
        return key[len(self._prefix) :].decode()

    def _call(self, method: str, request: Any) -> Any:
        if self._closed:
            raise KvUnavailable("kv backend is closed")
        try:
            return getattr(self._client.kvstub, method)(request, self.timeout)
        except (grpc.RpcError, etcd_exc.Etcd3Exception, ValueError) as exc:
            if isinstance(exc, grpc.RpcError):
                self._note_failure(exc)
            raise translate_etcd_error(exc) from exc

    def _note_failure(self, exc: grpc.RpcError) -> None:
        code = exc.code() if callable(getattr(exc, "code", None)) else None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            # Let pyetcd fail over to another endpoint on the next call.
            self._client.endpoint_in_use.fail()
            self._client._clear_old_stubs()

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
        resp = self._call("Range", etcdrpc.RangeRequest(key=self._full(key)))
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
        resp = self._call("Range", self._range_request(lo, hi, limit))
        return [
            KeyValue(self._bare(kv.key), bytes(kv.value), int(kv.mod_revision)) for kv in resp.kvs
        ]

    def scan(self, prefix: str, *, page_size: int = 1000) -> Iterator[KeyValue]:
        return scan_pages(self.range, prefix, page_size)

    def put(self, key: str, value: bytes) -> int:
        resp = self._call("Put", etcdrpc.PutRequest(key=self._full(key), value=value))
        return int(resp.header.revision)

    def delete(self, key: str) -> bool:
        resp = self._call("DeleteRange", etcdrpc.DeleteRangeRequest(key=self._full(key)))
        return int(resp.deleted) > 0

    def delete_prefix(self, prefix: str) -> int:
        lo = self._full(prefix)
        req = etcdrpc.DeleteRangeRequest(key=lo or b"\0", range_end=prefix_range_end(lo))
        return int(self._call("DeleteRange", req).deleted)

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
        resp = self._call("Txn", req)
        return TxnResult(succeeded=bool(resp.succeeded), revision=int(resp.header.revision))

    def batch_put(self, items: Sequence[tuple[str, bytes]]) -> None:
        if self._closed:
            raise KvUnavailable("kv backend is closed")
        # Deduplicate first so chunks touch disjoint keys and may commit in any order.
        latest = dict(items)
        pending: deque[Any] = deque()
        try:
            for chunk in self._chunks(latest):
                req = etcdrpc.TxnRequest(success=chunk)
                pending.append(self._client.kvstub.Txn.future(req, self.timeout))
                if len(pending) >= _BATCH_IN_FLIGHT:
                    pending.popleft().result()
            while pending:
                pending.popleft().result()
        except (grpc.RpcError, etcd_exc.Etcd3Exception, ValueError) as exc:
            for fut in pending:
                fut.cancel()
            if isinstance(exc, grpc.RpcError):
                self._note_failure(exc)
            raise translate_etcd_error(exc) from exc

    def _chunks(self, items: dict[str, bytes]) -> Iterator[list[Any]]:
        chunk: list[Any] = []
        size = 0
        for key, value in items.items():
            full = self._full(key)
            if chunk and (
                len(chunk) >= self.max_txn_ops or size + len(full) + len(value) > _BATCH_BYTES
            ):
                yield chunk
                chunk, size = [], 0
            chunk.append(etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=full, value=value)))
            size += len(full) + len(value)
        if chunk:
            yield chunk

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()

    def __repr__(self) -> str:
        return f"EtcdKv({self.endpoints!r}, key_prefix={self.key_prefix!r})"
