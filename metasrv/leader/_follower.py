"""A follower's warm copy of the topic-region map, so that winning an election costs a
catch-up, not a full load.

Every process that does not lead loads the map once and then follows every change from the
load's revision (`KvBackend.watch`: an etcd watch, or polling the SQL kv). When the watch
cannot go on (etcd compacted the revision, the member went away, keys deleted behind the
SQL poll) the follower loads in full again and watches from there.

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
from metasrv.process import Backoff, Jitter

logger = logging.getLogger(__name__)

POLL_SECS = 0.25
"""Longest wait for changes in one call (a take-over wakes the watch)."""
SYNC_SECS = 5.0
"""How long one catch-up waits for the store to confirm the map is current (then the
follower loads in full, still for the same take-over)."""
RETRY = Backoff(base=0.5, cap=30.0, jitter=Jitter.NONE)
"""Pauses between two attempts at loading after a failure: 0.5 s doubling to 30 s."""


class MapFollower:
    """Keeps `region_map` current while this process does not lead."""

    def __init__(self, region_map: TopicRegionMap, kv: KvBackend) -> None:
        self.region_map = region_map
        self._kv = kv
        self._task: asyncio.Task[None] | None = None
        self._handover: asyncio.Future[bool] | None = None
        self._watch: KvWatch | None = None
        """The watch being followed, woken for a take-over."""
        self.warm = False
        """True while the map is loaded and followed."""
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

    def start(self) -> None:
        """Load the map and follow it in the background (a no-op while following)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="map-follower")

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The following loop, while it runs."""
        return self._task

    async def stop(self) -> None:
        """Stop following (the map stays as it is)."""
        task, self._task = self._task, None
        self.warm = False
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def take_over(self, still_leading: Callable[[], bool]) -> bool:
        """Stop following and bring the map up to the store's current revision (a catch-up,
        or a full load when the watch was lost). True when the map is current; False when
        following had stopped, or leadership went first (the caller loads in full). A
        first load still running is waited for, not started again."""
        while not self.warm and self._task is not None and not self._task.done():
            if not still_leading():
                return False
            await asyncio.sleep(0.05)
        task = self._task
        if task is None or task.done() or not self.warm:
            await self.stop()
            return False
        handover = asyncio.get_running_loop().create_future()
        self._handover = handover
        if self._watch is not None:
            self._watch.wake()  # the catch-up starts now, not when the wait ends
        while not handover.done() and still_leading():
            await asyncio.wait({handover}, timeout=0.1)
        current = handover.done() and handover.result()
        await self.stop()
        self._handover = None
        return current

    def _note_read(self, routes: int) -> None:
        self.routes_read = routes

    async def _run(self) -> None:
        failures = 0
        while True:
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
                self.warm = True
                failures = 0
                self._watch = watch
                await self._follow(watch)
                return  # handed over
            except MetasrvError as exc:
                self.warm = False
                logger.warning(
                    "following the topic-region map stopped; loading it again",
                    extra={"error": str(exc)},
                )
                if self._handover is not None:
                    continue  # a take-over waits: load again at once
                await asyncio.sleep(RETRY.delay(failures))
                failures += 1
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
                self._handover = None
                if not handover.done():
                    handover.set_result(True)
                return
            changes = await asyncio.to_thread(watch.next, self.poll_secs)
            if changes:
                region_map.apply(changes)
