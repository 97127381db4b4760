"""The topic's marker (`__topic_name/kafka/{topic}`): read, advance, latch a reset.

The marker only moves forward, by compare-and-swap under the election fence (DESIGN §2
invariant 5); regions replay from max(flushed_entry_id, marker) + 1. Each advance
records the Kafka topic id its offsets belong to, and a topic reset (invariant 8) is
latched into it until an operator resolves it. What value to write is decided by the
pure `advanced_marker` / `reset_marker` (`_plan.py`); this module only reads and writes.
A marker that does not decode is `DamagedMarker` (not retried), never "never purged".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from metasrv import keys
from metasrv.errors import Conflict, LeadershipLost
from metasrv.keys import Marker
from metasrv.kv import Compare, KeyValue, Put
from procedures.wal_purge._plan import Reset, advanced_marker, reset_marker
from procedures.wal_purge._services import PurgeServices

logger = logging.getLogger(__name__)

_MARKER_CAS_TRIES = 8
_SCAN_PAGE = 20_000


def decode_stored(kv: KeyValue | None) -> Marker | None:
    """The marker a stored key holds (None: absent); `DamagedMarker` when it does not
    decode: the purge fails rather than guess a marker (`keys.read_marker`)."""
    return None if kv is None else keys.read_marker(kv.key, kv.value)


async def read_marker(services: PurgeServices, topic: str) -> tuple[Marker | None, KeyValue | None]:
    """The topic's marker and the raw key (for a CAS); `DamagedMarker` when damaged."""
    loop = asyncio.get_running_loop()
    kv = await loop.run_in_executor(services.executor, services.kv.get, keys.topic_name(topic))
    return decode_stored(kv), kv


async def read_markers(services: PurgeServices, strict: Collection[str] = ()) -> dict[str, Marker]:
    """Every stored marker, in one scan (the ticker's and the API's view). A damaged one
    is left out (`keys.marker_or_none`; the purge itself fails on it), except for the
    topics in `strict`, which a caller named: theirs is `DamagedMarker` (`keys.read_marker`),
    as the region view and replay-start answer."""
    named = frozenset(strict)

    def read() -> dict[str, Marker]:
        found: dict[str, Marker] = {}
        for kv in services.kv.scan(keys.TOPIC_NAME_PREFIX, page_size=_SCAN_PAGE):
            topic = kv.key[len(keys.TOPIC_NAME_PREFIX) :]
            if topic in named:
                found[topic] = keys.read_marker(kv.key, kv.value)
                continue
            marker = keys.marker_or_none(kv.key, kv.value)
            if marker is not None:
                found[topic] = marker
        return found

    return await asyncio.get_running_loop().run_in_executor(services.executor, read)


_UNREAD = KeyValue("", b"", -1)


async def _swap(
    services: PurgeServices,
    topic: str,
    change: Callable[[Marker | None], Marker | None],
    current: KeyValue | None,
    what: str,
) -> tuple[Marker | None, bool]:
    """Write `change(marker)` by fenced CAS, re-reading on a lost compare; (the marker
    before, whether it was written). `change` returning None writes nothing."""
    loop = asyncio.get_running_loop()
    key = keys.topic_name(topic)
    for _ in range(_MARKER_CAS_TRIES):
        if current is _UNREAD:
            current = await loop.run_in_executor(services.executor, services.kv.get, key)
        previous = decode_stored(current)
        new = change(previous)
        if new is None:
            return previous, False
        value = keys.encode_marker(new, current.value if current is not None else None)
        compares = [
            Compare(key, revision=current.mod_revision if current is not None else 0),
            *services.election.fence(),
        ]
        result = await services.committer.txn(compares, [Put(key, value)])
        if result.succeeded:
            return previous, True
        again = await loop.run_in_executor(services.executor, services.kv.get, key)
        same = (again is None and current is None) or (
            again is not None and current is not None and again.mod_revision == current.mod_revision
        )
        if same:
            raise LeadershipLost(f"not leader any more; {what} of {topic} not written")
        # The key changed since it was read (another writer, or a stale read): retry.
        current = again
    raise Conflict(f"marker of {topic} kept changing; {what} not written", retryable=True)


async def advance_marker(
    services: PurgeServices,
    topic: str,
    target: int,
    *,
    current: KeyValue | None = _UNREAD,
    topic_id: str | None = None,
) -> int | None:
    """Set the topic's `pruned_entry_id` to `target` unless it is already >= target,
    recording Kafka's `topic_id` when known.

    Compare-and-swap on the key's revision plus the election fence (invariant 5): the
    marker never moves backwards, and a deposed leader cannot move it at all. A reset
    latched meanwhile, or another topic id recorded, raises `TopicReset`. Returns the
    marker's previous entry id. `current` may pass the key as just read (a stale one
    only costs a retry).
    """
    previous, _ = await _swap(
        services,
        topic,
        lambda marker: advanced_marker(marker, target, topic_id),
        current,
        "marker",
    )
    return None if previous is None else previous.pruned_entry_id


async def latch_reset(
    services: PurgeServices, topic: str, reset: Reset, *, current: KeyValue | None = _UNREAD
) -> bool:
    """Latch `reset` into the topic's marker (fenced CAS, the entry id kept); False when a
    reset was latched already (the first one found stays)."""
    _, written = await _swap(
        services, topic, lambda marker: reset_marker(marker, reset), current, "reset latch"
    )
    return written
