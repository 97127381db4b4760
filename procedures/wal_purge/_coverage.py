"""The purge's archive check (DESIGN §8, invariant 10): with `[wal.archive] enabled`, nothing
is deleted from Kafka that the bucket does not hold.

The purge step calls `check_archived` after its last read (the marker, Kafka's offsets, the
pinned groups' offsets: `gather_one`) and its decision (`Advance` or `CatchUp`), before the
marker moves and before DeleteRecords: one listing of the topic's objects
(`{prefix}{topic}/`, `archived_ranges`), whatever the number of regions, then the pure
`decide_archived`. A gap in [Kafka's log start, target), or a store that does not answer,
blocks the topic: the step deletes nothing and ends skipped (`not_archived`). A resumed or
retried purge step checks again, as every run of it reads again.

Each check's verdict is kept per topic in `ArchiveVerdicts` (the plan views show the last
blocking one as `not_archived`, until a check passes) and in the leader's gauge
`metasrv_wal_archive_blocked{topic}` (alert `MetasrvWalArchiveLagging`). The store is
never asked by a plan view: a view shows what the last purge found.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from metasrv.errors import MetasrvError
from procedures.wal_purge._archive import archived_ranges
from procedures.wal_purge._plan import NotArchived, decide_archived
from procedures.wal_purge._services import PurgeServices

if TYPE_CHECKING:
    from metasrv.archive import ArchivedRange

logger = logging.getLogger(__name__)

COVERAGE_WAIT = 10.0
"""Seconds the purge step waits for the listing of a topic's objects (it holds the topic's
write lock meanwhile); past it the store counts as not answering and nothing is deleted."""


async def check_archived(
    services: PurgeServices, topic: str, log_start: int, target: int
) -> NotArchived | None:
    """None when the purge may delete `topic` below `target` from Kafka's `log_start` (as
    the step read it): the archive is disabled, nothing is left to delete, or one listing of
    the bucket holds [log_start, target) with no gap. Else why not (`NotArchived`). Records
    the verdict and sets the topic's `metasrv_wal_archive_blocked` gauge."""
    settings = services.settings.wal.archive
    if not settings.enabled:
        return None
    ranges: list[ArchivedRange] | None = None
    error = ""
    if log_start < target:  # else nothing to delete: no listing
        try:
            ranges = await archived_ranges(
                settings, topic, timeout=COVERAGE_WAIT, wanted=(log_start, target)
            )
        except MetasrvError as exc:
            error = f"{exc.code}: {exc.message}"
    verdict = decide_archived(target, log_start, ranges, error=error)
    services.archive_verdicts.record(topic, verdict)
    services.metrics.archive_blocked.labels(topic=topic).set(0 if verdict is None else 1)
    if verdict is not None:
        logger.warning(
            "purge blocked: the WAL archive does not hold what it would delete",
            extra={
                "topic": topic,
                "log_start": log_start,
                "target": target,
                "gap": verdict.gap,
                "error": verdict.error,
            },
        )
    return verdict
