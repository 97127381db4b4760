"""The `KvBackend` protocol: what metasrv needs from etcd or a SQL table.

Keys are text (the DESIGN §4 layout, see metasrv/keys.py), values are bytes (JSON).
Every key carries a `mod_revision` that changes on each write; compare-and-swap
transactions compare it (0 means "the key must not exist") or compare the value.
A backend applies its configured `key_prefix` itself: callers always use bare keys.

`snapshot()` is the read for batch jobs: the whole store as of one revision, read page by
page under as many prefixes as the job needs, unaffected by writes made meanwhile.

`watch(prefix, after_revision)` follows the changes under a prefix from a known revision (a
follower's warm copy) and returns a `KvWatch`. Its reader calls `next` in a loop, applying
what it returns, and `sync` once when it must be current: `sync` returns a revision R such
that every change up to R has been returned (by `sync` itself or an earlier `next`). A
watch that cannot go on (etcd compacted the revision it needed, the member went away, the
database is unreachable) raises `WatchLost`: the reader reloads in full and watches again
from the reload's revision. etcd watches with a gRPC stream (`_etcd_watch.py`), SQL by
polling (`_sql_watch.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from metasrv.errors import KvUnavailable


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One stored key."""

    key: str
    """Key without the backend's key prefix."""
    value: bytes
    """Stored bytes (JSON by convention)."""
    mod_revision: int
    """Revision of the last write to this key; > 0 for any existing key."""


@dataclass(frozen=True, slots=True)
class Compare:
    """A transaction guard on one key: its revision, or its value, must match."""

    key: str
    revision: int | None = None
    """Expected `mod_revision`; 0 means the key must be absent."""
    value: bytes | None = None
    """Expected value (the key must exist and hold exactly these bytes)."""

    def __post_init__(self) -> None:
        if (self.revision is None) == (self.value is None):
            raise ValueError("Compare needs exactly one of revision= or value=")


@dataclass(frozen=True, slots=True)
class Put:
    """Transaction operation: write `value` at `key`."""

    key: str
    value: bytes
    """Bytes to store."""


@dataclass(frozen=True, slots=True)
class Delete:
    """Transaction operation: remove `key` (no error when absent)."""

    key: str


TxnOp = Put | Delete


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Outcome of `KvBackend.txn`."""

    succeeded: bool
    """True when every compare held and the success ops were applied."""
    revision: int
    """Store revision after the transaction (new `mod_revision` of keys it wrote)."""


@dataclass(frozen=True, slots=True)
class BatchUpdate:
    """Outcome of `KvBackend.batch_update`."""

    written: Sequence[str]
    """Keys written (each existed when its chunk was applied)."""
    fenced: bool
    """True when a chunk found a fence compare false: nothing of that chunk was written
    (the writer was deposed; chunks applied before it may have landed)."""


@dataclass(frozen=True, slots=True)
class KeyPage:
    """One page of a snapshot read: keys and their values, index for index.

    Two parallel sequences rather than `KeyValue`s, so a bulk reader can hand them to a
    columnar decoder as they are.
    """

    keys: Sequence[str]
    """Keys without the backend's key prefix."""
    values: Sequence[bytes]
    """Stored bytes; `values[i]` belongs to `keys[i]`."""


class Snapshot(Protocol):
    """The store as of one revision, readable until the `with` block that opened it ends."""

    @property
    def revision(self) -> int:
        """Store revision the snapshot shows (0 for a store never written): every key
        it returns was last written at or before it, and no write after it is seen."""
        ...

    def pages(self, prefix: str, *, page_size: int = 1000) -> Iterator[KeyPage]:
        """Every key under `prefix` exactly once, in pages of at most `page_size` keys.

        Keys come in no promised order (a backend may return them in storage order,
        which is faster than key order), and no page is empty.
        """
        ...


@dataclass(frozen=True, slots=True)
class KvChange:
    """One key written or removed."""

    key: str
    """Key without the backend's key prefix."""
    value: bytes | None
    """The value written; None when the key was deleted."""
    revision: int
    """Store revision of the change."""


class WatchLost(KvUnavailable):
    """The watch cannot continue from where its reader is: reload in full."""


class KvWatch(Protocol):
    """Changes under one prefix after a revision (see the module docstring)."""

    def next(self, timeout: float) -> list[KvChange]:
        """Changes since the last call, in revision order; empty after `timeout` seconds
        without any."""
        ...

    def sync(self, timeout: float) -> tuple[list[KvChange], int]:
        """The changes not yet returned and a revision R, at least the store's revision
        when `sync` was called, such that every change up to R is now returned."""
        ...

    def wake(self) -> None:
        """Make the `next` that waits now, or else the next one, return at once (maybe
        empty); any thread may call it. A reader that must `sync` calls it first."""
        ...

    def close(self) -> None:
        """Stop watching; safe to call twice."""
        ...


@runtime_checkable
class KvBackend(Protocol):
    """Blocking kv store. Async callers run it in a worker thread (`asyncio.to_thread`).

    Errors: `KvUnavailable` when the store cannot be reached, `TxnTooLarge` when an
    atomic transaction exceeds `max_txn_ops`. Nothing else escapes.
    """

    max_txn_ops: int
    """Largest number of compares + ops one atomic transaction may carry."""

    def get(self, key: str) -> KeyValue | None:
        """Return the key, or None when absent."""
        ...

    def range(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> list[KeyValue]:
        """Return up to `limit` keys starting with `prefix`, in key order, after `start_after`."""
        ...

    def scan(self, prefix: str, *, page_size: int = 1000) -> Iterator[KeyValue]:
        """Iterate over every key under `prefix`, page by page."""
        ...

    def snapshot(self) -> AbstractContextManager[Snapshot]:
        """Open a read-only view of the whole store at its current revision:
        `with kv.snapshot() as snap: for page in snap.pages(prefix): ...`.

        Every `pages` call of one snapshot reads the same revision, so several prefixes
        read in turn are consistent with each other. For batch reads of many keys; it
        holds a database transaction (SQL) or relies on etcd keeping the revision until
        compaction, so keep it open only as long as the read.
        """
        ...

    def watch(
        self, prefix: str, after_revision: int, *, holds_after: Callable[[list[KvChange]], int]
    ) -> KvWatch:
        """Follow the changes under `prefix` after `after_revision` (a snapshot's revision):
        see the module docstring. `holds_after(changes)` is how many keys under `prefix`
        the reader holds once it applies `changes` (the SQL watch finds deletes by it)."""
        ...

    def put(self, key: str, value: bytes) -> int:
        """Write unconditionally; return the new `mod_revision`."""
        ...

    def delete(self, key: str) -> bool:
        """Remove the key; return whether it existed."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Remove every key under `prefix`; return how many were removed."""
        ...

    def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnOp],
        failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        """Atomically apply `success` if every compare holds, else `failure`."""
        ...

    def batch_put(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Write many keys, chunked under `max_txn_ops`; atomic per chunk only."""
        ...

    def batch_update(
        self, items: Sequence[tuple[str, bytes]], fence: Sequence[Compare]
    ) -> BatchUpdate:
        """Overwrite the keys of `items` that exist, chunked as `batch_put` (at the same
        throughput: several transactions in flight on etcd, one statement per chunk on
        SQL). Each chunk is applied only while every `fence` compare holds, else none of
        it; a key absent when its chunk is applied is skipped, never created. Atomic per
        chunk only. The leader's checkpoint writes: a deposed leader's late slice never
        lands, and a route deleted behind it is never brought back."""
        ...

    def close(self) -> None:
        """Release connections; safe to call twice."""
        ...
