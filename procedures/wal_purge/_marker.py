"""The topic's `pruned_entry_id` marker (`__topic_name/kafka/{topic}`): read and advance.

The marker only moves forward, by compare-and-swap under the election fence (DESIGN §2
invariant 5); regions replay from max(flushed_entry_id, marker) + 1.
"""

from __future__ import annotations

import asyncio

from metasrv import keys
from metasrv.errors import Conflict, LeadershipLost
from metasrv.kv import Compare, KeyValue, Put
from procedures.wal_purge._services import PurgeServices

_MARKER_CAS_TRIES = 8


def _pruned(kv: KeyValue | None) -> int | None:
    # A damaged marker raises ValueError: the step fails rather than guess a marker.
    return None if kv is None else keys.decode_pruned(kv.value)


async def read_marker(services: PurgeServices, topic: str) -> tuple[int | None, KeyValue | None]:
    """The topic's `pruned_entry_id` and the raw key (for a CAS)."""
    loop = asyncio.get_running_loop()
    kv = await loop.run_in_executor(services.executor, services.kv.get, keys.topic_name(topic))
    return _pruned(kv), kv


_UNREAD = KeyValue("", b"", -1)


async def advance_marker(
    services: PurgeServices, topic: str, target: int, *, current: KeyValue | None = _UNREAD
) -> int | None:
    """Set the topic's `pruned_entry_id` to `target` unless it is already >= target.

    Compare-and-swap on the key's revision plus the election fence (invariant 5): the
    marker never moves backwards, and a deposed leader cannot move it at all. Returns
    the marker's previous value. `current` may pass the key as just read (a stale one
    only costs a retry).
    """
    loop = asyncio.get_running_loop()
    key = keys.topic_name(topic)
    for _ in range(_MARKER_CAS_TRIES):
        if current is _UNREAD:
            current = await loop.run_in_executor(services.executor, services.kv.get, key)
        previous = _pruned(current)
        if previous is not None and previous >= target:
            return previous
        value = keys.encode_pruned(target, current.value if current is not None else None)
        compares = [
            Compare(key, revision=current.mod_revision if current is not None else 0),
            *services.election.fence(),
        ]
        result = await services.committer.txn(compares, [Put(key, value)])
        if result.succeeded:
            return previous
        again = await loop.run_in_executor(services.executor, services.kv.get, key)
        same = (again is None and current is None) or (
            again is not None and current is not None and again.mod_revision == current.mod_revision
        )
        if same:
            raise LeadershipLost(f"not leader any more; marker of {topic} not advanced")
        # The key changed since it was read (another writer, or a stale read): retry.
        current = again
    raise Conflict(f"marker of {topic} kept changing; not advanced", retryable=True)
