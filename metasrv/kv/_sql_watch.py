"""`KvWatch` on the SQL kv (see `_protocol.py`), by polling.

Puts are the keys whose `mod_revision` passed the last one read (an index on it, migration
0005, keeps that cheap); a row delete leaves nothing to find, so the watch compares the
prefix's key count with the keys its reader would hold once it applied the puts
(`holds_after`), and raises `WatchLost` when keys went missing. It counts when the store's
`deleted_revision` (the latest write that removed a key, migration 0005) is past the
revision of its last count that matched, and at least every `count_every` seconds while
following; `sync` counts only in the first case, so a take-over with no delete since does
not count every key under the prefix. The periodic count is for a writer that does not
mark its deletes (a metasrv older than migration 0005, during an upgrade). Deletes under
the topic-region prefix are deregistrations, rare next to puts, so a reload for each costs
a follower little.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from metasrv.kv._protocol import KvChange, WatchLost
from metasrv.sql import kv_revision_table, kv_table

_Polled = tuple[int, list[tuple[str, bytes, int]], int | None]
"""One poll's read: the store's revision, the (key, value, mod_revision) puts, the count."""


class SqlWatch:
    """`KvWatch` on the SQL kv by polling (see the module docstring)."""

    def __init__(
        self,
        read: Callable[[Callable[[Connection], _Polled]], _Polled],
        in_prefix: Any,
        cut: int,
        prefix: str,
        after_revision: int,
        *,
        holds_after: Callable[[list[KvChange]], int],
        poll_interval: float = 0.5,
        count_every: float = 5.0,
    ) -> None:
        """`read(fn)` runs `fn(conn)` in one read transaction of the store; `in_prefix`
        selects the rows under `prefix` (the key prefix included), whose first `cut`
        characters are the backend's key prefix."""
        self._read = read
        self._in_prefix = in_prefix
        self._cut = cut
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
        cut = self._cut
        in_prefix = self._in_prefix

        def read(conn: Connection) -> _Polled:
            rev_stmt = select(
                kv_revision_table.c.revision, kv_revision_table.c.deleted_revision
            ).where(kv_revision_table.c.id == 1)
            marks = conn.execute(rev_stmt).one_or_none()
            revision, deleted = (0, 0) if marks is None else (int(marks[0]), int(marks[1]))
            count = periodic or deleted > self._clean_through
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
        revision, rows, found = self._read(read)
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
