"""What the WAL archive holds of a topic (DESIGN §8), read once per question.

`archived_ranges` lists the topic's objects (`{prefix}{topic}/`, one paginated listing) in a
thread, bounded by a timeout, and keeps the keys that name archived objects; `archive_covers`
says whether they hold a range, with no gap (`metasrv.archive.covering`). The purge's WAL
data-loss report says with it whether the archive holds what Kafka lost, and replay-start
(api/queries.py) names the objects a region replays first. Each listing also leaves what it
found in `LISTED` (`ArchivedSpan` per topic), which the dashboard shows: the store is never
asked on a page view.

The store client is built per question: the archive is read only on those rare paths, and
a process without `[wal.archive] enabled` never builds one, nor loads `metasrv.archive`
(boto3 and the archiver's pyarrow: a quarter of a second at every start otherwise).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metasrv.errors import InvalidArgument, ObjectStoreUnavailable
from metasrv.settings import ArchiveSettings

if TYPE_CHECKING:
    from metasrv.archive import ArchivedRange

LISTINGS = 3
"""Listings of one topic's archive merged, at most, before a range they leave short is
believed: S3Proxy's filesystem backend can leave existing objects out of a listing made
while another object of the same topic is being written (13 of 103 listings under a
steady stream of puts). Objects are immutable and only retention deletes them, below
anything a purge or a replay asks for, so an object any listing saw is there."""

_STORE_BUILD = threading.Lock()
"""boto3 builds clients from one default session, which is not thread-safe."""


@dataclass(frozen=True, slots=True)
class ArchivedSpan:
    """What one listing found of a topic's archive: the run of entries from the lowest
    archived one with no gap, [first_entry_id, end)."""

    first_entry_id: int | None
    """None: no object."""
    end: int | None
    """One past the last entry of the gapless run from `first_entry_id`."""
    gap: bool
    """Objects lie beyond a gap after `end`."""
    objects: int
    listed_at: float
    """Unix seconds."""

    @classmethod
    def of(cls, ranges: Sequence[ArchivedRange], listed_at: float) -> ArchivedSpan:
        ordered = sorted(ranges, key=lambda r: r.first_entry_id)
        if not ordered:
            return cls(None, None, False, 0, listed_at)
        end = ordered[0].first_entry_id
        for r in ordered:
            if r.first_entry_id > end:
                break
            end = max(end, r.end)
        gap = max(r.end for r in ordered) > end
        return cls(ordered[0].first_entry_id, end, gap, len(ordered), listed_at)


class ListedArchive:
    """The last listing of each topic's archive this process made, by bucket, prefix and
    topic (written by `archived_ranges`, read by the dashboard)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[tuple[str, str, str], ArchivedSpan] = {}

    def record(self, settings: ArchiveSettings, topic: str, span: ArchivedSpan) -> None:
        with self._lock:
            self._spans[(settings.bucket, settings.prefix, topic)] = span

    def spans(self, settings: ArchiveSettings) -> dict[str, ArchivedSpan]:
        """Topic -> its last listed span, in `settings`' bucket and prefix."""
        key = (settings.bucket, settings.prefix)
        with self._lock:
            return {t: s for (b, p, t), s in self._spans.items() if (b, p) == key}


LISTED = ListedArchive()


async def archived_ranges(
    settings: ArchiveSettings,
    topic: str,
    *,
    timeout: float,
    wanted: tuple[int, int] | None = None,
) -> list[ArchivedRange]:
    """The ranges of `topic`'s archived objects, in key order. Keys under the topic's
    prefix that do not name an archived object are skipped. With `wanted`, [start, end) a
    caller needs: while the objects listed leave it short, the topic is listed again, up to
    `LISTINGS` listings in all, and what they saw merged. `ObjectStoreUnavailable` when the
    store does not answer within `timeout` seconds; the store's other errors as
    `ObjectStore` raises them."""

    from metasrv.archive import ObjectStore, covering, parse_object_key, topic_prefix

    def read() -> list[ArchivedRange]:
        with _STORE_BUILD:
            store = ObjectStore(settings, timeout=timeout, max_attempts=1)
        seen: dict[str, ArchivedRange] = {}
        try:
            for _ in range(LISTINGS):
                for obj in store.list(topic_prefix(settings.prefix, topic)):
                    try:
                        seen[obj.key] = parse_object_key(settings.prefix, obj.key)
                    except InvalidArgument:
                        continue  # not an archived object (DESIGN §8 names every one)
                if wanted is None or covering(list(seen.values()), *wanted).covered:
                    break
        finally:
            store.close()
        return [seen[key] for key in sorted(seen)]

    try:
        # The client keeps to `timeout` per request; this bounds the listings and their pages.
        ranges = await asyncio.wait_for(asyncio.to_thread(read), timeout + 0.5)
    except TimeoutError:
        raise ObjectStoreUnavailable(
            f"object store: no listing of {topic}'s archive within {timeout:g}s",
            details={"topic": topic},
        ) from None
    LISTED.record(settings, topic, ArchivedSpan.of(ranges, time.time()))
    return ranges


async def covering_chain(
    settings: ArchiveSettings, topic: str, start: int, end: int, *, timeout: float
) -> tuple[ArchivedRange, ...] | None:
    """A shortest chain of `topic`'s archived objects holding [start, end), in entry order
    (`metasrv.archive.covering`), or None when they leave a gap; raises as
    `archived_ranges`."""
    from metasrv.archive import covering

    ranges = await archived_ranges(settings, topic, timeout=timeout, wanted=(start, end))
    coverage = covering(ranges, start, end)
    return coverage.objects if coverage.covered else None


def archive_covers(ranges: Sequence[ArchivedRange] | None, start: int, end: int) -> bool | None:
    """Whether `ranges` hold every entry of [start, end); None when they are unknown (the
    archive disabled, or its store did not answer)."""
    if ranges is None:
        return None
    from metasrv.archive import covering

    return covering(ranges, start, end).covered
