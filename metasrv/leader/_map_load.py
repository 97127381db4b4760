"""Reading the whole topic-region map at one kv revision (a leader's or follower's full load).

Reading, decoding and indexing all happen on the caller's thread (a worker thread: at a
million routes that is seconds of work the event loop must not wait behind).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import NamedTuple

from metasrv import keys
from metasrv.kv import KeyPage, KvBackend
from metasrv.model import RegionRoute

logger = logging.getLogger(__name__)

SCAN_PAGE = 20_000
"""Routes per range read (about 2 MB). etcd counts the rest of the range on every paged
read, so the whole scan costs pages x keys: 5,000 per page made a 1M-route map load take
67 s, 20,000 a fraction of that (`benchmarks/leader_map_load.py`)."""


class Loaded(NamedTuple):
    by_id: dict[int, RegionRoute]
    by_topic: dict[str, dict[int, RegionRoute]]
    malformed: set[str]
    """Keys under the prefix that are not `{topic}/{region_id}` (counted, never mapped)."""
    revision: int
    """The kv revision every route was read at."""


def read_map(kv: KvBackend, progress: Callable[[int], None] | None = None) -> Loaded:
    by_id: dict[int, RegionRoute] = {}
    by_topic: dict[str, dict[int, RegionRoute]] = {}
    malformed: set[str] = set()
    with kv.snapshot() as snap:
        revision = snap.revision
        pages = snap.pages(keys.TOPIC_REGION_PREFIX, page_size=SCAN_PAGE)
        if progress is not None:
            pages = _counted(pages, progress)
        for key, value in (kv for page in pages for kv in zip(page.keys, page.values, strict=True)):
            route = keys.decode_route(key, value)
            if route is None:
                malformed.add(key)
                continue
            map_route(by_id, by_topic, route)
    return Loaded(by_id, by_topic, malformed, revision)


def map_route(
    by_id: dict[int, RegionRoute], by_topic: dict[str, dict[int, RegionRoute]], route: RegionRoute
) -> bool:
    """Index one stored route key: the one rule every reader of the map follows (a full
    load, a follower applying changes, the leader's own writes), so a map followed
    change by change is the map a full load of the same kv gives. Return whether
    `by_id` now holds `route`.

    The map is the set of route keys. A region whose key appears under two topics
    (registration refuses it, so only a write from outside metasrv or a bug makes one) is
    mapped under each: neither topic is planned without it, whatever key came last.
    Its route (`by_id`: the topic its reports must name) is the one under the lowest
    topic name, so it does not depend on the order keys were read or written in.
    """
    region_id = route.region_id
    by_topic.setdefault(route.topic, {})[region_id] = route
    held = by_id.get(region_id)
    if held is not None and held.topic != route.topic:
        logger.error(
            "region mapped to two topics",
            extra={"region_id": region_id, "topics": sorted([held.topic, route.topic])},
        )
    if held is None or route.topic <= held.topic:
        by_id[region_id] = route
        return True
    return False


def unmap_route(
    by_id: dict[int, RegionRoute],
    by_topic: dict[str, dict[int, RegionRoute]],
    topic: str,
    region_id: int,
) -> RegionRoute | None:
    """Remove the key `{topic}/{region_id}` from the index; return its route (None when
    it is not mapped there). A region still mapped under another topic keeps the route
    `map_route` would give it."""
    regions = by_topic.get(topic)
    removed = None if regions is None else regions.pop(region_id, None)
    if removed is None:
        return None
    if not regions:
        del by_topic[topic]
    held = by_id.get(region_id)
    if held is not None and held.topic == topic:
        # O(topics), on removals only: the rare region under two topics is found again.
        others = [t for t, mapped in by_topic.items() if region_id in mapped]
        if others:
            by_id[region_id] = by_topic[min(others)][region_id]
        else:
            del by_id[region_id]
    return removed


def _counted(pages: Iterator[KeyPage], progress: Callable[[int], None]) -> Iterator[KeyPage]:
    """`pages`, calling `progress` with the keys read so far after each one is indexed."""
    read = 0
    for page in pages:
        yield page
        read += len(page.keys)
        progress(read)
