"""The loop that feeds the WAL trend (`TrendRing`) on the leader.

Every `[dashboard] sample_interval`, while this process leads, one round:

- asks Kafka for the offsets of every topic with regions in one batched ListOffsets call
  (`KafkaBatcher.offsets_tolerant`, as the plans of the ticker and the API do) and
  records high watermark - log start per topic, in bytes too: entries x the datanodes'
  average record size, the formula of the `metasrv_wal_retained_*` gauges;
- when the completed-purge counter (`metasrv_wal_purges_total`) moved, reads that many
  of the newest purges from the SQL history and adds those not yet held.

Nothing is planned: a round costs one Kafka request, O(topics) work and, only after
purges, one SQL read, however many regions are mapped.

The trend belongs to a leadership term: a process that stops leading drops it, and a
new term starts with no samples and the purges of the last window read back from the
SQL history. A loop on the ticker (`PeriodicLoop`), a round at start.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterable

from metasrv.metrics import Metrics
from metasrv.model import retained_entries
from metasrv.process import ErrorSink, PeriodicLoop, log_only
from metasrv.wire import PurgeRecord
from procedures.wal_purge._inputs import OFFSETS_WAIT
from procedures.wal_purge._services import PurgeServices
from procedures.wal_purge._trend import PURGE_CAPACITY, PurgeMark, Retained, TrendRing

logger = logging.getLogger(__name__)


def trend_capacity(sample_interval: float, window: float) -> int:
    """Sample slots covering `window` at one sample per `sample_interval` (both ends)."""
    return max(1, math.ceil(window / sample_interval) + 1) if sample_interval > 0 else 1


def purges_total(metrics: Metrics) -> float:
    """`metasrv_wal_purges_total`, summed over topics (what this process completed)."""
    return sum(
        s.value
        for family in metrics.purges.collect()
        for s in family.samples
        if s.name.endswith("_total")
    )


def purge_marks(records: Iterable[PurgeRecord]) -> list[PurgeMark]:
    """History rows as marks."""
    return [
        PurgeMark(
            at=r.finished_at.timestamp(),
            topic=sys.intern(r.topic),  # one string per topic, however many purges
            procedure_id=r.procedure_id,
            prune_point=r.prune_point,
            entries_deleted=r.entries_deleted,
            bytes_estimated=r.bytes_estimated,
            logical_delete=r.logical_delete,
        )
        for r in records
    ]


class TrendSampler(PeriodicLoop):
    """Samples retained WAL and completed purges into `ring` while this process leads."""

    task_name = "wal-trend"
    round_first = True

    def __init__(
        self,
        services: PurgeServices,
        *,
        sample_interval: float,
        window: float,
        term: Callable[[], int | None],
        purge_capacity: int = PURGE_CAPACITY,
        on_error: ErrorSink | None = None,
    ) -> None:
        super().__init__(on_error or log_only("wal_trend"))
        """`term()` names the leadership term while this process serves as leader, None
        otherwise. A `sample_interval` of 0 keeps no trend (the loop does not start)."""
        self.services = services
        self.sample_interval = sample_interval
        self.window = window
        self.ring = TrendRing(
            trend_capacity(sample_interval, window), purge_capacity=purge_capacity
        )
        self._term = term
        self._sampled_term: int | None = None
        """The term the ring holds; None: nothing (not leading, or not caught up)."""
        self._purges_seen = 0.0
        """`purges_total` when the history was last read into the ring."""

    @property
    def enabled(self) -> bool:
        return self.sample_interval > 0

    @property
    def term(self) -> int | None:
        """The leadership term the ring's samples belong to (None: no trend kept now)."""
        return self._sampled_term

    def next_round_in(self) -> float:
        return self.sample_interval

    async def round(self) -> None:
        await self.sample_once()

    async def sample_once(self) -> None:
        """One round (see module docstring); clears the ring when the term changed."""
        term = self._term()
        if term != self._sampled_term:
            self.ring.clear()
            self._sampled_term = None
            if term is None:
                return
            # Read the counter first: a purge finishing during the read shows next round.
            seen = purges_total(self.services.metrics)
            await self._read_purges(self.ring.purge_capacity)
            self._purges_seen = seen
            self._sampled_term = term
        if term is None or not self.services.region_map.loaded:
            return
        await self._sample_retained()
        total = purges_total(self.services.metrics)
        if total > self._purges_seen:
            await self._read_purges(int(total - self._purges_seen) + 8)
            self._purges_seen = total
        self.ring.drop_purges_before(time.time() - self.window)

    async def _sample_retained(self) -> None:
        services = self.services
        topics = [t for t, routes in services.region_map.routes_by_topic().items() if routes]
        offsets, _ = (
            await services.batcher.offsets_tolerant(topics, timeout=OFFSETS_WAIT)
            if topics
            else ({}, {})
        )
        stats = services.registry.topic_stats()
        retained: dict[str, Retained] = {}
        for topic, found in offsets.items():
            entries = retained_entries(found.log_start_offset, found.high_watermark)
            stat = stats.get(topic)
            size = None if stat is None else int(stat.bytes_of(entries))
            retained[topic] = Retained(entries=entries, bytes=size)
        self.ring.record(time.time(), retained)

    async def _read_purges(self, newest: int) -> None:
        if newest <= 0:
            return
        rows = await self.services.history.purges(limit=newest)  # capped by the history
        since = time.time() - self.window
        self.ring.add_purges(m for m in purge_marks(rows) if m.at >= since)
