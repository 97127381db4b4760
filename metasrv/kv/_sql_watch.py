"""Following the changes under a prefix from a known revision (a follower's warm copy).

`KvBackend.watch(prefix, after_revision)` returns a `KvWatch`. Its reader calls `next` in a
loop, applying what it returns, and `sync` once when it must be current: `sync` returns a
revision R such that every change up to R has been returned (by `sync` itself or an
earlier `next`). A watch that cannot go on (etcd compacted the revision it needed, the
member went away, the database is unreachable) raises `WatchLost`: the reader reloads in
full and watches again from the reload's revision.

- etcd: a gRPC watch stream (`_etcd_watch.py`); `sync` asks for a progress notification,
  which etcd sends once every event up to its current revision is on the stream.
- SQL: polling (`SqlWatch`): puts are the keys whose `mod_revision` passed the last one
  read (an index on it, migration 0005, keeps that cheap); a row delete leaves nothing to
  find, so the watch compares the prefix's key count with the keys its reader would hold
  once it applied the puts (`holds_after`), and raises `WatchLost` when keys went missing.
  It counts when the store's `deleted_revision` (the latest write that removed a key,
  migration 0005) is past the revision of its last count that matched, and at least every
  `count_every` seconds while following; `sync` counts only in the first case, so a
  take-over with no delete since does not count every key under the prefix. The periodic
  count is for a writer that does not mark its deletes (a metasrv older than migration
  0005, during an upgrade). Deletes under the topic-region prefix are deregistrations,
  rare next to puts, so a reload for each costs a follower little.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from metasrv.errors import KvUnavailable
from metasrv.sql import kv_revision_table, kv_table

if TYPE_CHECKING:
    from metasrv.kv._sql import SqlKv


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


class SqlWatch:
    """`KvWatch` on the SQL kv by polling (see the module docstring)."""

    def __init__(
        self,
        kv: SqlKv,
        prefix: str,
        after_revision: int,
        *,
        holds_after: Callable[[list[KvChange]], int],
        poll_interval: float = 0.5,
        count_every: float = 5.0,
    ) -> None:
        self._kv = kv
        self._prefix = prefix
        self._revision = after_revision
        self._holds_after = holds_after
        self._poll_interval = poll_interval
        self._count_every = count_every
        self._counted_at = time.monotonic()
        self._clean_through = after_revision
        """No key under the prefix was removed at or below this revision without the
        reader seeing it (the load's revision, then each matching count's)."""
        self._closed = False
        self._woken = threading.Event()

    def next(self, timeout: float) -> list[KvChange]:
        if self._woken.wait(min(self._poll_interval, max(timeout, 0.0))):
            self._woken.clear()
            return []
        changes, _ = self._poll(periodic=time.monotonic() - self._counted_at >= self._count_every)
        return changes

    def sync(self, timeout: float) -> tuple[list[KvChange], int]:
        return self._poll(periodic=False)

    def wake(self) -> None:
        self._woken.set()

    def close(self) -> None:
        self._closed = True

    def _poll(self, *, periodic: bool) -> tuple[list[KvChange], int]:
        """The puts since the last poll; the keys counted when `periodic` or when a key
        was removed since the last matching count (`deleted_revision`)."""
        if self._closed:
            raise WatchLost("kv watch is closed")
        kv = self._kv
        cut = len(kv.key_prefix)

        def read(conn: Connection) -> tuple[int, list[tuple[str, bytes, int]], int | None]:
            rev_stmt = select(
                kv_revision_table.c.revision, kv_revision_table.c.deleted_revision
            ).where(kv_revision_table.c.id == 1)
            marks = conn.execute(rev_stmt).one_or_none()
            revision, deleted = (0, 0) if marks is None else (int(marks[0]), int(marks[1]))
            count = periodic or deleted > self._clean_through
            in_prefix = kv._prefix_clause(self._prefix)
            rows = conn.execute(
                select(kv_table.c.key, kv_table.c.value, kv_table.c.mod_revision)
                .where(
                    in_prefix,
                    kv_table.c.mod_revision > self._revision,
                    kv_table.c.mod_revision <= revision,
                )
                .order_by(kv_table.c.mod_revision)
            ).all()
            found = None
            if count:
                found = int(
                    conn.execute(
                        select(func.count()).select_from(kv_table).where(in_prefix)
                    ).scalar_one()
                )
            return revision, [(r[0], r[1], r[2]) for r in rows], found

        # One repeatable read: the revision, the puts and the count agree.
        revision, rows, found = kv.run_in_transaction(read, write=False)
        changes = [KvChange(key[cut:], bytes(value), int(rev)) for key, value, rev in rows]
        self._revision = max(self._revision, revision)
        if found is not None:
            self._counted_at = time.monotonic()
            held = self._holds_after(changes)
            if held != found:
                raise WatchLost(
                    f"{found} keys under {self._prefix!r} at revision {revision}, the "
                    f"follower would hold {held}: keys were deleted; reload"
                )
            self._clean_through = revision
        return changes, self._revision
