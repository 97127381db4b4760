"""Batched persistence of region checkpoints (DESIGN §4).

Heartbeats only mark regions dirty: the checkpointer's dirty set (`DirtyRows`, a flag per
row of the term's stat table, `RegionRegistry.dirty_rows`), so a region that changes on
every heartbeat between two flushes is held once; a flush takes the set and reads it a
batch of `region_id -> checkpoint` at a time (`PendingCheckpoints`). A background task
writes each dirty region's `__topic_region/{topic}/{region_id}` checkpoint
`{"entry_id": prunable}` when `wal.checkpoint_batch` regions are dirty or every
`wal.checkpoint_interval`, whichever comes first, and once more on shutdown; a flush
reads, encodes and writes (`batch_put`) `FLUSH_SLICE` regions at a time, so the event loop
serves heartbeats in between. Flushes are at least a tenth of the interval apart
(`min_gap`), so a storm of changing stats coalesces (each region is written once per
flush, however often it changed) instead of turning into a write stream as fast as
heartbeats arrive. The background writer also keeps to `wal.checkpoint_rate` regions per
second: when a new leader hears a million regions for the first time, their first
checkpoints reach the kv over minutes instead of as one burst that takes the cores the
heartbeats need (etcd spends far more CPU per key than the leader does). Only regions
whose prunable entry id or node changed are marked, and unchanged checkpoints are skipped,
so an idle fleet writes nothing. A new term's background writer also waits for its first
round (`Term`): until every mapped region has reported, or one `wal.checkpoint_interval`
has passed, it writes nothing, so the cores the kv would take go to the first reports, the
term's costliest heartbeats. The checkpoint is what `replay-start` falls back to when the
leader holds no live stat; a checkpoint that lags is safe (the region replays a little
more).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Iterable

import numpy as np

from metasrv.errors import LeadershipLost, MetasrvError
from metasrv.leader._region_map import TopicRegionMap
from metasrv.leader._region_stats import DirtyRows, Verdict
from metasrv.leader._registry import RegionRegistry
from metasrv.leader._term import FIRST_ROUND_CHECK, Term
from metasrv.metrics import Metrics
from metasrv.process import ErrorSink, PeriodicLoop, log_only
from metasrv.settings import Settings

logger = logging.getLogger(__name__)


FLUSH_SLICE = 4096
"""Regions read and encoded per step of a flush (~2 ms of event-loop work at 100k regions,
measured in process; each step's kv write runs on a thread)."""

PACE_STEP = 0.1
"""Seconds of `wal.checkpoint_rate` written per step of a paced flush: small steps keep the
kv's load smooth."""


def _always() -> bool:
    return True


class Checkpointer(PeriodicLoop):
    """Dirty-region set plus the background task that persists it (a loop on the ticker;
    `stop` writes what is still dirty)."""

    task_name = "checkpointer"
    stop_grace = math.inf

    def __init__(
        self,
        region_map: TopicRegionMap,
        registry: RegionRegistry,
        settings: Settings,
        metrics: Metrics,
        *,
        may_write: Callable[[], bool] = _always,
        on_error: ErrorSink | None = None,
        flush_slice: int = FLUSH_SLICE,
        term: Term | None = None,
    ) -> None:
        super().__init__(on_error or log_only("checkpointer"))
        self._region_map = region_map
        self._slice = flush_slice
        self._registry = registry
        self._metrics = metrics
        self._interval = settings.wal.checkpoint_interval
        self._batch = settings.wal.checkpoint_batch
        self._rate = settings.wal.checkpoint_rate
        self.min_gap = min(self._interval / 10, 1.0) if self._interval > 0 else 0.1
        """Least seconds between two flushes (except the final one on `stop`)."""
        self._last_flush = float("-inf")
        self._may_write = may_write
        self._cleared = 0
        """Times `clear` ran: a paced flush that sees it change drops what it holds."""
        self.term = term or Term(region_map, registry)
        """Begun by `clear`: the background writer holds a term's first flush until its
        first round is in, one interval at most."""
        self.error_pause = min(self._interval or 1.0, 5.0)
        """After a failed flush: a dead kv is not hammered by a full dirty set."""
        self._flush_lock = asyncio.Lock()
        self._dirty = registry.dirty_rows()
        """Rows whose checkpoint is to be written (`mark`, `mark_judged`)."""
        self.flushes = 0
        """Completed flushes that wrote at least one key (tests and status)."""

    @property
    def dirty_count(self) -> int:
        """Regions waiting to be written."""
        return len(self._rows())

    def _rows(self) -> DirtyRows:
        """The dirty set of the registry's current table (a new term's table starts
        with none dirty)."""
        self._dirty = self._registry.dirty_rows(self._dirty)
        return self._dirty

    def mark(self, region_ids: Iterable[int] | np.ndarray) -> None:
        """Note regions (with a row in the registry) whose prunable entry id or node
        changed: their checkpoints are to be written; wakes the writer early once a
        batch is full."""
        ids = region_ids.tolist() if isinstance(region_ids, np.ndarray) else list(region_ids)
        if ids:
            self._rows().mark(ids)
            self._wake_if_full()

    def mark_judged(self, verdict: Verdict) -> None:
        """`mark` for the rows a stored heartbeat changed (`Verdict.store`)."""
        self._rows().mark_judged(verdict)
        self._wake_if_full()

    def _wake_if_full(self) -> None:
        if len(self._dirty) >= self._batch:
            self.wake()

    def clear(self) -> None:
        """Forget every dirty region (leadership changed; the new stats start empty),
        those of a paced flush under way included."""
        self._dirty = self._registry.dirty_rows()
        self._cleared += 1
        self.term.begin()

    async def flush(self, *, paced: bool = False) -> int:
        """Write every dirty region's checkpoint now; return the keys written.

        Each slice is written only while `may_write()` says this process leads, and
        carries the election's fence (`TopicRegionMap.set_checkpoints`); once either
        fails, the rest of the flush is dropped. `paced` (the background writer) keeps
        to `wal.checkpoint_rate` regions a second until `stop` is called, then writes
        the rest at once. Regions marked
        during a flush wait for the next one. On a kv error the regions not yet written
        stay dirty for the next attempt and the error propagates.
        """
        async with self._flush_lock:
            self._wake.clear()
            dirty = self._rows()
            if not len(dirty):
                return 0
            pending = dirty.take()
            cleared = self._cleared
            pace = paced and self._rate > 0
            step = max(1, min(self._slice, int(self._rate * PACE_STEP))) if pace else self._slice
            loop = asyncio.get_running_loop()
            started = loop.time()
            written = 0
            # A slice at a time, the kv write of each awaited: the event loop serves
            # heartbeats between slices instead of stalling for the whole dirty set.
            while len(pending):
                read = pending.read
                if pace and read:
                    ahead = read / self._rate - (loop.time() - started)
                    if ahead > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._shutdown.wait(), ahead)
                if self._cleared != cleared:
                    break  # a new term: these rows are the old table's
                # Asked before every slice, not once per flush: a paced flush lasts
                # minutes, and leadership can end in any of them. The kv fence each
                # slice carries stops a leader that does not know yet it was deposed.
                if not self._may_write():
                    break
                updates = pending.next_batch(step)
                try:
                    count = await self._region_map.set_checkpoints(updates)
                except LeadershipLost:
                    # Deposed: nothing of this term is written any more (the next term
                    # starts from empty stats, `clear`).
                    logger.warning("checkpoint flush stopped: leadership lost")
                    break
                except BaseException:
                    pending.put_back()
                    raise
                # Counted as written: a paced flush of a million regions takes minutes.
                self._metrics.checkpoint_writes.inc(count)
                written += count
            if written:
                self.flushes += 1
            return written

    def next_round_in(self) -> float | None:
        return self._interval if self._interval > 0 else None

    async def round(self) -> None:
        wait = self._last_flush + self.min_gap - asyncio.get_running_loop().time()
        if await self.sleep(wait):
            return
        while self.term.awaiting_first_round(self._interval):
            if await self.sleep(FIRST_ROUND_CHECK):
                return
        self._last_flush = asyncio.get_running_loop().time()
        # On a kv error the regions stay dirty; counted, and the next flush retries them.
        await self.flush(paced=True)

    async def drained(self) -> None:
        """The last flush, on `stop`, at once (not paced)."""
        try:
            await self.flush()
        except MetasrvError:
            logger.exception("final checkpoint flush failed; checkpoints may lag")
