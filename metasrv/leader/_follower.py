"""A follower's warm copy of the topic-region map, so that winning an election costs a
catch-up, not a full load.

Every process that does not lead loads the map once and then follows every change from the
load's revision (`KvBackend.watch`: an etcd watch, or polling the SQL kv). When the watch
cannot go on (etcd compacted the revision, the member went away, keys deleted behind the
SQL poll) the follower loads in full again and watches from there.

The following runs on the process's one ticker (`PeriodicLoop`): a round loads the map and
follows it until a take-over; after a round that failed, the next one starts after
`RETRY`'s backoff (at once when a take-over waits for it).

On election, `take_over` wakes the watch from its wait for changes (`KvWatch.wake`), stops
following and brings the map to a revision read after the election (`KvWatch.sync`): a
region registered by the old leader was committed before the new leader's election
revision (afterwards the old leader's fenced writes fail), so it is in the map before the
new leader plans any purge (DESIGN §2 invariant 4). A map that is not warm, or a catch-up
that fails, makes the caller load in full instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from metasrv import keys
from metasrv.errors import MetasrvError
from metasrv.kv import KvBackend, KvWatch
from metasrv.leader._region_map import TopicRegionMap
from metasrv.process import Backoff, ErrorSink, Jitter, PeriodicLoop

logger = logging.getLogger(__name__)

POLL_SECS = 0.25
"""Longest wait for changes in one call (a take-over wakes the watch)."""
SYNC_SECS = 5.0
"""How long one catch-up waits for the store to confirm the map is current (then the
follower loads in full, still for the same take-over)."""
RETRY = Backoff(base=0.5, cap=30.0, jitter=Jitter.NONE)
"""Pauses between two attempts at loading after a failure: 0.5 s doubling to 30 s."""
LEADING_CHECK_SECS = 0.05
"""While a take-over waits for the follower, how often it asks whether this process still
leads (a plain predicate: nothing signals its change)."""


class MapFollower:
    """Keeps `region_map` current while this process does not lead."""

    def __init__(
        self, region_map: TopicRegionMap, kv: KvBackend, on_error: ErrorSink | None = None
    ) -> None:
        """`on_error` gets what a round raised other than a store's trouble (which is
        logged and retried here): a bug, for the supervisor to report."""
        self.region_map = region_map
        self._kv = kv
        self._loop = _FollowLoop(self, on_error)
        self._handover: asyncio.Future[bool] | None = None
        self._warmed = asyncio.Event()
        self._failures = 0
        """Rounds failed in a row (the backoff's attempt)."""
        self._watch: KvWatch | None = None
        """The watch being followed, woken for a take-over."""
        self.reloads = 0
        """Full loads since start (the first one included)."""
        self.routes_read = 0
        """Routes the full load under way has read so far (the last load's count once it is
        done). Written by the loading worker thread; read for `/readyz`."""
        self.poll_secs = POLL_SECS
        """Longest wait for changes in one call to the watch."""
        self.loaded_listeners: list[Callable[[], None]] = []
        """Called after each full load, before the map is followed (`LeaderView` prepares
        the next term's stat table)."""

    @property
    def warm(self) -> bool:
        """True while the map is loaded and followed."""
        return self._warmed.is_set()

    def start(self) -> None:
        """Load the map and follow it in the background (a no-op while following)."""
        self._loop.launch()

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The following loop, while it runs."""
        return self._loop.task

    async def stop(self) -> None:
        """Stop following (the map stays as it is)."""
        self._warmed.clear()
        await self._loop.stop()

    async def take_over(self, still_leading: Callable[[], bool]) -> bool:
        """Stop following and bring the map up to the store's current revision (a catch-up,
        or a full load when the watch was lost). True when the map is current; False when
        following had stopped, or leadership went first (the caller loads in full). A
        first load still running is waited for, not started again."""
        while not self.warm and self._following():
            if not still_leading():
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._warmed.wait(), LEADING_CHECK_SECS)
        if not self._following() or not self.warm:
            await self.stop()
            return False
        handover = asyncio.get_running_loop().create_future()
        self._handover = handover
        if self._watch is not None:
            self._watch.wake()  # the catch-up starts now, not when the wait ends
        while not handover.done() and still_leading():
            await asyncio.wait({handover}, timeout=LEADING_CHECK_SECS)
        current = handover.done() and handover.result()
        await self.stop()
        self._handover = None
        return current

    def _following(self) -> bool:
        task = self._loop.task
        return task is not None and not task.done()

    def _note_read(self, routes: int) -> None:
        self.routes_read = routes

    def _next_round_in(self) -> float | None:
        if self._handover is not None and not self._handover.done():
            return 0.0  # a take-over waits: load again at once
        if self._failures == 0:
            return None  # handed over: nothing until `stop`
        return RETRY.delay(self._failures - 1)

    async def _round(self) -> None:
        """Load the map in full, then follow it until a take-over; a store's trouble ends
        the round (the next one loads again)."""
        watch: KvWatch | None = None
        try:
            self.routes_read = 0
            await self.region_map.load(self._note_read)
            self.reloads += 1
            for listener in self.loaded_listeners:
                listener()
            region_map = self.region_map
            watch = await asyncio.to_thread(
                self._kv.watch,
                keys.TOPIC_REGION_PREFIX,
                region_map.revision,
                holds_after=region_map.holds_after,
            )
            self._warmed.set()
            self._failures = 0
            self._watch = watch
            await self._follow(watch)
        except MetasrvError as exc:
            self._warmed.clear()
            self._failures += 1
            logger.warning(
                "following the topic-region map stopped; loading it again",
                extra={"error": str(exc)},
            )
        except Exception:
            self._warmed.clear()
            self._failures += 1
            raise
        finally:
            self._watch = None
            if watch is not None:
                watch.close()

    async def _follow(self, watch: KvWatch) -> None:
        region_map = self.region_map
        while True:
            handover = self._handover
            if handover is not None:
                started = time.monotonic()
                changes, revision = await asyncio.to_thread(watch.sync, SYNC_SECS)
                region_map.apply(changes)
                region_map.revision = max(region_map.revision, revision)
                logger.info(
                    "topic-region map current for the new term",
                    extra={
                        "revision": revision,
                        "changes": len(changes),
                        "seconds": round(time.monotonic() - started, 3),
                    },
                )
                if not handover.done():
                    handover.set_result(True)
                return
            changes = await asyncio.to_thread(watch.next, self.poll_secs)
            if changes:
                region_map.apply(changes)


class _FollowLoop(PeriodicLoop):
    """The follower's rounds on the one ticker: the first at once, the next after a failed
    one's backoff, none after a take-over (`MapFollower._next_round_in`)."""

    task_name = "map-follower"
    round_first = True

    def __init__(self, follower: MapFollower, on_error: ErrorSink | None) -> None:
        super().__init__(on_error)
        self._follower = follower

    def next_round_in(self) -> float | None:
        return self._follower._next_round_in()

    async def round(self) -> None:
        await self._follower._round()
