"""What the WAL archive holds of a topic (DESIGN §8), read once per question.

`archived_ranges` lists the topic's objects (`{prefix}{topic}/`, one paginated listing) in a
thread, bounded by a timeout, and keeps the keys that name archived objects; `archive_covers`
says whether they hold a range, with no gap (`metasrv.archive.covering`). The purge's WAL
data-loss report says with it whether the archive holds what Kafka lost, and replay-start
(api/queries.py) names the objects a region replays first.

The store client is built per question: the archive is read only on those rare paths, and
a process without `[wal.archive] enabled` never builds one, nor loads `metasrv.archive`
(boto3 and the archiver's pyarrow: a quarter of a second at every start otherwise).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from metasrv.errors import InvalidArgument, ObjectStoreUnavailable
from metasrv.settings import ArchiveSettings

if TYPE_CHECKING:
    from metasrv.archive import ArchivedRange

_STORE_BUILD = threading.Lock()
"""boto3 builds clients from one default session, which is not thread-safe."""


async def archived_ranges(
    settings: ArchiveSettings, topic: str, *, timeout: float
) -> list[ArchivedRange]:
    """The ranges of `topic`'s archived objects, in key order. Keys under the topic's
    prefix that do not name an archived object are skipped. `ObjectStoreUnavailable` when
    the store does not answer within `timeout` seconds; the store's other errors as
    `ObjectStore` raises them."""

    from metasrv.archive import ObjectStore, parse_object_key, topic_prefix

    def read() -> list[ArchivedRange]:
        with _STORE_BUILD:
            store = ObjectStore(settings, timeout=timeout, max_attempts=1)
        try:
            listed = store.list(topic_prefix(settings.prefix, topic))
        finally:
            store.close()
        ranges = []
        for obj in listed:
            try:
                ranges.append(parse_object_key(settings.prefix, obj.key))
            except InvalidArgument:
                continue  # not an archived object (DESIGN §8 names every one)
        return ranges

    try:
        # The client keeps to `timeout` per request; this bounds a listing of many pages.
        return await asyncio.wait_for(asyncio.to_thread(read), timeout + 0.5)
    except TimeoutError:
        raise ObjectStoreUnavailable(
            f"object store: no listing of {topic}'s archive within {timeout:g}s",
            details={"topic": topic},
        ) from None


async def covering_chain(
    settings: ArchiveSettings, topic: str, start: int, end: int, *, timeout: float
) -> tuple[ArchivedRange, ...] | None:
    """A shortest chain of `topic`'s archived objects holding [start, end), in entry order
    (`metasrv.archive.covering`), or None when they leave a gap; raises as
    `archived_ranges`."""
    from metasrv.archive import covering

    coverage = covering(await archived_ranges(settings, topic, timeout=timeout), start, end)
    return coverage.objects if coverage.covered else None


def archive_covers(ranges: Sequence[ArchivedRange] | None, start: int, end: int) -> bool | None:
    """Whether `ranges` hold every entry of [start, end); None when they are unknown (the
    archive disabled, or its store did not answer)."""
    if ranges is None:
        return None
    from metasrv.archive import covering

    return covering(ranges, start, end).covered
