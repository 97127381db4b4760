"""Helpers shared by the kv backends: prefix bounds, op collapsing, size checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from metasrv.errors import TxnTooLarge
from metasrv.kv._protocol import Compare, KeyValue, TxnOp

RangeFn = Callable[..., list[KeyValue]]

_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


def prefix_upper_bound(prefix: str) -> str | None:
    """Smallest string greater than every string starting with `prefix`, or None if unbounded.

    Code point order equals UTF-8 byte order, so this bound also works for stores that
    compare keys bytewise (SQLite BINARY collation, PostgreSQL "C" collation).
    """
    chars = list(prefix)
    while chars:
        last = ord(chars[-1])
        if last < _MAX_CODE_POINT:
            nxt = last + 1
            if nxt in _SURROGATES:
                # Surrogates cannot be encoded; the next encodable code point is U+E000.
                nxt = _SURROGATES.stop
            chars[-1] = chr(nxt)
            return "".join(chars)
        chars.pop()
    return None


def prefix_range_end(prefix: bytes) -> bytes:
    """etcd's range_end for a prefix: the prefix with its last non-0xff byte incremented.

    Returns b"\\0" (etcd's "every key >= key") when the prefix is empty or all 0xff.
    """
    buf = bytearray(prefix)
    while buf:
        if buf[-1] < 0xFF:
            buf[-1] += 1
            return bytes(buf)
        buf.pop()
    return b"\0"


def collapse_ops(ops: Sequence[TxnOp]) -> list[TxnOp]:
    """Keep only the last operation per key, in the order of those last operations.

    The final state is the same as applying `ops` in order; etcd refuses a txn that
    names one key twice, and the SQL backend writes each key once.
    """
    last: dict[str, TxnOp] = {}
    for op in ops:
        last.pop(op.key, None)
        last[op.key] = op
    return list(last.values())


def check_txn_size(
    backend: str,
    max_txn_ops: int,
    compares: Sequence[Compare],
    success: Sequence[TxnOp],
    failure: Sequence[TxnOp],
) -> None:
    """Raise `TxnTooLarge` when the compares or either branch exceed `max_txn_ops`.

    Same rule as etcd's server (`--max-txn-ops`): the largest of the three lists counts.
    """
    size = max(len(compares), len(success), len(failure))
    if size > max_txn_ops:
        raise TxnTooLarge(
            f"{backend} transaction too large: {len(compares)} compares, "
            f"{len(success)} success ops, {len(failure)} failure ops; at most "
            f"{max_txn_ops} of each are allowed. Split the work (batch_put chunks "
            "automatically).",
            details={"ops": size, "max_txn_ops": max_txn_ops},
        )


def scan_pages(range_fn: RangeFn, prefix: str, page_size: int) -> Iterator[KeyValue]:
    """`KvBackend.scan` on top of `range`: page after page, each after the last key seen."""
    start_after: str | None = None
    while True:
        page = range_fn(prefix, start_after=start_after, limit=page_size)
        yield from page
        if len(page) < page_size:
            return
        start_after = page[-1].key
