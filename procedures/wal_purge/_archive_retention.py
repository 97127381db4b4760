"""The WAL archive's retention on the leader (DESIGN §8): objects wholly below every mapped
region's replay start and older than `[wal.archive] retention` are deleted; `"0s"` keeps
every object (the loop does not start).

Which objects (`expired_objects`, pure): an object whose last entry is below a topic's floor and
whose store write is older than the retention. The floor is min(marker + 1, Kafka's log
start): every region replays from max(prunable, marker, in-flight target) + 1, never below
marker + 1, so an object below the floor is below every mapped region's replay start,
registered now or later, without reading any stat; and it is below Kafka's log start, so
Kafka no longer holds its entries either: an object a purge's coverage check still needs
([log start, target), `_coverage.py`) is never deleted (otherwise a marker ahead of Kafka,
a deletion pending, would block every later purge of the topic). A topic without a marker,
with a reset latched, or whose Kafka topic id is not the marker's is left alone: the
bucket's keys name offsets, not the topic's incarnation.

A round lists each topic's objects once (`{prefix}{topic}/`) and deletes one by one; only
the leader deletes (every replica runs the loop).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from metasrv.errors import InvalidArgument
from metasrv.process import ErrorSink, PeriodicLoop
from procedures.wal_purge._marker import read_markers

if TYPE_CHECKING:
    from metasrv.archive import StoredObject
    from procedures.wal_purge._services import PurgeServices

logger = logging.getLogger(__name__)

_STORE_BUILD = threading.Lock()
"""boto3 builds clients from one default session, which is not thread-safe."""
_STORE_TIMEOUT = 10.0


def retention_interval(retention: float) -> float:
    """Seconds between two rounds: a quarter of the retention, between 10 s and 1 h."""
    return min(3600.0, max(10.0, retention / 4))


def expired_objects(
    objects: Sequence[StoredObject], prefix: str, floor: int, *, older_than: float
) -> list[str]:
    """Keys of `objects` (one topic's listing) whose entries all lie below `floor` and that
    were written before `older_than` (Unix seconds); keys that name no archived object
    are kept."""
    from metasrv.archive import parse_object_key

    keys = []
    for obj in objects:
        try:
            held = parse_object_key(prefix, obj.key)
        except InvalidArgument:
            continue
        if held.last_entry_id < floor and obj.last_modified.timestamp() < older_than:
            keys.append(obj.key)
    return keys


class ArchiveRetention(PeriodicLoop):
    """Deletes expired archived objects (module docstring) every `interval`, while
    `leading()`."""

    task_name = "archive-retention"
    round_first = True

    def __init__(
        self,
        services: PurgeServices,
        *,
        leading: Callable[[], bool],
        interval: float | None = None,
        on_error: ErrorSink | None = None,
    ) -> None:
        super().__init__(on_error)
        self.services = services
        settings = services.settings.wal.archive
        self.retention = settings.retention
        self.interval = retention_interval(self.retention) if interval is None else interval
        self._leading = leading

    @property
    def enabled(self) -> bool:
        settings = self.services.settings.wal.archive
        return settings.enabled and self.retention > 0

    def next_round_in(self) -> float:
        return self.interval

    async def round(self) -> None:
        await self.trim_once()

    async def trim_once(self) -> int:
        """Delete what has expired now, if leading; returns how many objects."""
        if not self.enabled or not self._leading():
            return 0
        services = self.services
        topics = list(services.region_map.topics())
        if not topics:
            return 0
        markers = await read_markers(services)
        kept = {t: m for t, m in markers.items() if t in set(topics)}
        marked = [t for t, m in kept.items() if m.pruned_entry_id is not None and m.reset is None]
        if not marked:
            return 0
        offsets, _failed = await services.batcher.offsets_tolerant(marked, timeout=10.0)
        floors: dict[str, int] = {}
        for topic in marked:
            found, marker = offsets.get(topic), kept[topic]
            if found is None or marker.pruned_entry_id is None:
                continue  # Kafka did not answer: nothing is known of its log start
            if marker.topic_id is not None and found.topic_id != marker.topic_id:
                continue  # a reset, or Kafka did not say which topic this is
            floors[topic] = min(marker.pruned_entry_id + 1, found.log_start_offset)
        older_than = time.time() - self.retention
        deleted = await asyncio.to_thread(self._delete_expired, floors, older_than)
        if deleted:
            logger.info("deleted expired WAL archive objects", extra={"deleted": deleted})
        return deleted

    def _delete_expired(self, floors: dict[str, int], older_than: float) -> int:
        from metasrv.archive import ObjectStore, topic_prefix

        settings = self.services.settings.wal.archive
        with _STORE_BUILD:
            store = ObjectStore(settings, timeout=_STORE_TIMEOUT)
        deleted = 0
        try:
            for topic, floor in floors.items():
                if self.stopping:
                    break
                listed = store.list(topic_prefix(settings.prefix, topic))
                for key in expired_objects(listed, settings.prefix, floor, older_than=older_than):
                    store.delete(key)
                    deleted += 1
        finally:
            store.close()
        return deleted
