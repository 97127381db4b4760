"""Gathering a topic's prune plan inputs (routes, stats, marker, offsets) for procedures.

The plan itself is the pure `metasrv.prune_plan.plan_topic`; this module only collects
its inputs at one instant and reads/writes the topic's `pruned_entry_id` marker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from metasrv import keys
from metasrv.errors import Conflict, LeadershipLost
from metasrv.kv import Compare, KeyValue, Put
from metasrv.model import RegionRoute, RegionStat, TopicPlan
from metasrv.prune_plan import plan_topic
from procedures._services import Services

logger = logging.getLogger(__name__)

_MARKER_CAS_TRIES = 8


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """A topic's plan plus the inputs it was computed from."""

    plan: TopicPlan
    """The plan."""
    routes: tuple[RegionRoute, ...]
    """Every region mapped to the topic."""
    stats: Mapping[int, RegionStat]
    """The registry snapshot used (may hold other topics' regions)."""


def decode_marker(kv: KeyValue | None) -> int | None:
    """`pruned_entry_id` from a `__topic_name/kafka/{topic}` value."""
    if kv is None:
        return None
    value = orjson.loads(kv.value).get("pruned_entry_id")
    return None if value is None else int(value)


async def read_marker(services: Services, topic: str) -> tuple[int | None, KeyValue | None]:
    """The topic's `pruned_entry_id` and the raw key (for a CAS)."""
    loop = asyncio.get_running_loop()
    kv = await loop.run_in_executor(services.executor, services.kv.get, keys.topic_name(topic))
    return decode_marker(kv), kv


async def plan_one(
    services: Services, topic: str, *, marker: tuple[int | None] | None = None
) -> PlanInputs:
    """Plan `topic` now: call only while holding the topic's write lock (invariant 4).

    `marker` passes a `pruned_entry_id` the caller has just read, saving a kv read.
    """
    if marker is None:
        pruned, _ = await read_marker(services, topic)
    else:
        (pruned,) = marker
    offsets = await services.batcher.offsets(topic)
    routes = tuple(services.topology.regions_of(topic))
    # One topic's rows: a region reporting on another topic is absent, which the planner
    # reads as "no stat" (it would anyway).
    stats = services.registry.topic_snapshot(topic)
    # Stats carry monotonic receive times; `now` must be the same clock.
    now = time.monotonic()
    plan = plan_topic(
        topic,
        routes,
        stats,
        now=now,
        stat_ttl=services.settings.wal.region_stat_ttl,
        pruned_entry_id=pruned,
        offsets=offsets,
    )
    return PlanInputs(plan, routes, stats)


async def plan_all(services: Services, pruned: Mapping[str, int | None]) -> dict[str, PlanInputs]:
    """Plan every topic that has regions, with batched offsets (the ticker's view; no locks).

    Topic by topic, each from a copy of its own rows, yielding to the event loop between
    topics: planning a million regions at once would hold heartbeats for a second.
    Topics whose offsets Kafka could not give (e.g. deleted) are left out and logged.
    """
    topology = services.topology
    routes = {t: r for t in topology.topics() if (r := topology.regions_of(t))}
    topics: Sequence[str] = list(routes)
    offsets = await services.batcher.offsets_tolerant(list(topics)) if topics else {}
    missing = [t for t in topics if t not in offsets]
    if missing:
        logger.warning("no Kafka offsets for some topics; not planned", extra={"topics": missing})
        topics = [t for t in topics if t in offsets]
    planned: dict[str, PlanInputs] = {}
    for topic in topics:
        stats = services.registry.topic_snapshot(topic)
        plan = plan_topic(
            topic,
            routes[topic],
            stats,
            # Stats carry monotonic receive times; `now` must be the same clock.
            now=time.monotonic(),
            stat_ttl=services.settings.wal.region_stat_ttl,
            pruned_entry_id=pruned.get(topic),
            offsets=offsets[topic],
        )
        planned[topic] = PlanInputs(plan, tuple(routes[topic]), stats)
        await asyncio.sleep(0)
    return planned


_UNREAD = KeyValue("", b"", -1)


async def advance_marker(
    services: Services, topic: str, target: int, *, current: KeyValue | None = _UNREAD
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
        previous = decode_marker(current)
        if previous is not None and previous >= target:
            return previous
        value = orjson.loads(current.value) if current is not None else {}
        value["pruned_entry_id"] = target
        compares = [
            Compare(key, revision=current.mod_revision if current is not None else 0),
            *services.election.fence(),
        ]
        result = await services.committer.txn(compares, [Put(key, orjson.dumps(value))])
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
