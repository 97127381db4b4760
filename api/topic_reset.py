"""Topic resets outside the purge (DESIGN §2 invariant 8): pool topics a new term finds
missing from Kafka although metasrv purged them, and the operator's resolve action.

- `split_pool(pool, existing, marked)`: pure; which missing pool topics a leader may
  create, and which it must not (they have a marker: metasrv knows offsets of a topic
  that is gone, and a new one under the name would start again at 0 and hide the loss).
- `report_missing(rt, topic, stored)`: a withheld topic is reported: logged as an error,
  a `topic_reset` event, and the reset latched into its marker by fenced compare-and-swap,
  so the purge, the plan and replay-start all see it until an operator resolves it.
- `resolve_reset(rt, topic, topic_id)`: the operator's action (`POST
  /v1/topics/{topic}/resolve-reset`), under the topic's write lock: the regions' stats
  are dropped and their checkpoints reset (every region reports again, at the new topic's
  offsets, before the topic is purged), then the marker is rewritten to
  `{"pruned_entry_id": null, "topic_id": <Kafka's id now>, "reset": null}`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from metasrv import keys
from metasrv.election import Election
from metasrv.errors import Conflict, DamagedMarker, LeadershipLost, NotFound
from metasrv.keys import Marker, ResetLatch
from metasrv.kv import Compare, KeyValue, KvBackend, Put
from metasrv.leader import RegionRegistry, TopicLocks, TopicRegionMap
from metasrv.wire import EventKind, WalEvent
from procedures.wal_purge import PurgeServices

logger = logging.getLogger(__name__)


class ResetRuntime(Protocol):
    """What a topic reset uses of the leader's components (`api.runtime.Runtime`, which
    calls this module and so is not imported by it)."""

    @property
    def kv(self) -> KvBackend: ...
    @property
    def election(self) -> Election: ...
    @property
    def purge(self) -> PurgeServices: ...
    @property
    def region_map(self) -> TopicRegionMap: ...
    @property
    def locks(self) -> TopicLocks: ...
    @property
    def registry(self) -> RegionRegistry: ...


MISSING_REASON = "topic_missing"
"""The reason latched for a pool topic a leader found missing from Kafka with a marker."""

_CAS_TRIES = 8


def split_pool(
    pool: Iterable[str], existing: Collection[str], marked: Collection[str]
) -> tuple[list[str], list[str]]:
    """(pool topics to create, pool topics withheld): of the pool topics Kafka lacks,
    those with a marker are never created automatically (invariant 8)."""
    missing = [t for t in pool if t not in existing]
    return [t for t in missing if t not in marked], [t for t in missing if t in marked]


def read_markers(kv: KvBackend, topics: Collection[str]) -> dict[str, KeyValue]:
    """The stored marker keys of `topics` (absent: never purged); one scan."""
    wanted = set(topics)
    found: dict[str, KeyValue] = {}
    if not wanted:
        return found
    for stored in kv.scan(keys.TOPIC_NAME_PREFIX):
        topic = stored.key[len(keys.TOPIC_NAME_PREFIX) :]
        if topic in wanted:
            found[topic] = stored
    return found


async def write_marker(
    rt: ResetRuntime, topic: str, current: KeyValue | None, marker: Marker
) -> bool:
    """Replace the marker key as read (`current`) with `marker`, by compare-and-swap on its
    revision plus the election's fence. False when the key changed since it was read;
    `LeadershipLost` when the fence broke."""
    key = keys.topic_name(topic)
    value = keys.encode_marker(marker, current.value if current is not None else None)
    compares = [
        Compare(key, revision=current.mod_revision if current is not None else 0),
        *rt.election.fence(),
    ]
    result = await asyncio.to_thread(rt.kv.txn, compares, [Put(key, value)])
    if result.succeeded:
        return True
    again = await asyncio.to_thread(rt.kv.get, key)
    unchanged = (again is None and current is None) or (
        again is not None and current is not None and again.mod_revision == current.mod_revision
    )
    if unchanged:
        raise LeadershipLost(f"not leader any more; marker of {topic} not written")
    return False


def _event(kind: EventKind, topic: str, message: str, details: Mapping[str, Any]) -> WalEvent:
    return WalEvent(
        topic=topic,
        kind=kind.value,
        region_id=None,
        details=dict(details),
        at=datetime.fromtimestamp(time.time(), tz=UTC),
        message=message,
    )


async def report_missing(rt: ResetRuntime, topic: str, stored: KeyValue) -> None:
    """A pool topic Kafka lacks although it has a marker (`stored`): log it as an error,
    record a `topic_reset` event and latch the reset into the marker (fenced CAS; a reset
    already latched is kept as it is). A damaged marker is reported, never rewritten."""
    message = (
        f"WAL topic {topic} is missing from Kafka but metasrv purged it (marker "
        f"{stored.value!r}): not recreated; its regions' WAL entries are lost. Create it "
        f"by hand and resolve the reset (metasrv topic resolve-reset) once its regions "
        f"replay from the new topic"
    )
    logger.error(message, extra={"topic": topic})
    rt.purge.events.emit(_event(EventKind.TOPIC_RESET, topic, message, {"reason": MISSING_REASON}))
    current: KeyValue | None = stored
    for _ in range(_CAS_TRIES):
        if current is None:
            return  # the marker was deleted meanwhile: nothing to latch into
        try:
            marker = keys.read_marker(current.key, current.value)
        except DamagedMarker:
            return  # reported (logged), never rewritten
        if marker.reset is not None:
            return
        latched = Marker(marker.pruned_entry_id, marker.topic_id, ResetLatch(MISSING_REASON))
        if await write_marker(rt, topic, current, latched):
            return
        current = await asyncio.to_thread(rt.kv.get, keys.topic_name(topic))
    raise Conflict(f"marker of {topic} kept changing; reset not latched", retryable=True)


@dataclass(frozen=True, slots=True)
class ResolvedReset:
    """What `resolve_reset` did."""

    topic: str
    topic_id: str
    """Kafka's topic id the marker now records."""
    regions: int
    """Regions whose stats were dropped and checkpoints reset."""
    previous: Marker
    """The marker as it was (its reset latch included)."""


async def resolve_reset(rt: ResetRuntime, topic: str, topic_id: str) -> ResolvedReset:
    """Resolve the reset latched in `topic`'s marker, given Kafka's current topic id.

    `NotFound`: metasrv knows no such topic. `Conflict` (409): no reset is latched, Kafka
    has no such topic now, or its id is not `topic_id` (the operator resolves the topic
    they looked at, not one recreated again since). Under the topic's write lock (no purge
    or registration meanwhile): every region of the topic loses its stat (it reports
    again before the topic is purged, and a report at the new topic's low offsets is not
    `stat_regressed`) and its checkpoint becomes -1 (flushed nothing: replay-start falls
    back to it); then the marker becomes `{"pruned_entry_id": null, "topic_id": topic_id,
    "reset": null}` by fenced compare-and-swap, the resolution's commit point.
    """
    region_map = rt.region_map
    if not region_map.has_topic(topic):
        raise NotFound(f"unknown topic: {topic}", details={"topic": topic})
    key = keys.topic_name(topic)
    async with rt.locks.write(topic):
        current = await asyncio.to_thread(rt.kv.get, key)
        previous = _latched(topic, current)
        try:
            offsets = await rt.purge.batcher.offsets(topic)
        except NotFound as exc:
            raise Conflict(
                f"Kafka has no topic {topic}: create it before resolving its reset",
                details={"topic": topic},
            ) from exc
        if offsets.topic_id != topic_id:
            raise Conflict(
                f"topic_id {topic_id} is not Kafka's id of {topic} now ({offsets.topic_id})",
                details={"topic": topic, "topic_id": offsets.topic_id},
            )
        routes = region_map.regions_of(topic)
        for route in routes:
            rt.registry.discard(route.region_id)
        checkpoints = {}
        for route in routes:
            now = region_map.route(route.region_id)
            if now is not None and now.topic == topic:
                checkpoints[route.region_id] = (now.node_id, -1)
        await region_map.set_checkpoints(checkpoints)
        resolved = Marker(None, topic_id, None)
        if not await write_marker(rt, topic, current, resolved):
            raise Conflict(
                f"marker of {topic} changed while resolving its reset; try again",
                details={"topic": topic},
                retryable=True,
            )
    message = (
        f"topic reset of {topic} resolved by an operator: marker cleared, topic id "
        f"{topic_id} recorded, {len(routes)} region(s) must report again"
    )
    logger.warning(message, extra={"topic": topic, "topic_id": topic_id})
    details: dict[str, Any] = {
        "topic_id": topic_id,
        "regions": len(routes),
        "previous_pruned_entry_id": previous.pruned_entry_id,
        "previous_topic_id": previous.topic_id,
        "reset_reason": previous.reset.reason if previous.reset is not None else None,
    }
    rt.purge.events.emit(_event(EventKind.TOPIC_RESET_RESOLVED, topic, message, details))
    return ResolvedReset(topic, topic_id, len(routes), previous)


def _latched(topic: str, current: KeyValue | None) -> Marker:
    """The stored marker, which must have a reset latched (`Conflict` otherwise)."""
    if current is None:
        raise Conflict(f"no topic reset is latched on {topic}", details={"topic": topic})
    marker = keys.read_marker(current.key, current.value)
    if marker.reset is None:
        raise Conflict(f"no topic reset is latched on {topic}", details={"topic": topic})
    return marker
