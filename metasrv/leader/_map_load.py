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
            previous = by_id.get(route.region_id)
            if previous is not None and previous.topic != route.topic:
                # Should never happen (registration checks); keep both keys visible
                # in the plan by mapping it under each topic, and say so loudly.
                logger.error(
                    "region mapped to two topics",
                    extra={
                        "region_id": route.region_id,
                        "topics": [previous.topic, route.topic],
                    },
                )
            by_id[route.region_id] = route
            by_topic.setdefault(route.topic, {})[route.region_id] = route
    return Loaded(by_id, by_topic, malformed, revision)


def _counted(pages: Iterator[KeyPage], progress: Callable[[int], None]) -> Iterator[KeyPage]:
    """`pages`, calling `progress` with the keys read so far after each one is indexed."""
    read = 0
    for page in pages:
        yield page
        read += len(page.keys)
        progress(read)
