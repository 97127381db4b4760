"""The leader's view of the regions, started and dropped as one unit by `Leadership`.

Starting it drops whatever an earlier term left, then brings the topic-region map current:
from the follower's warm copy when it has one (`MapFollower.take_over`), else by a full
load (retrying while this process still leads); then it reserves a stat slot for every
mapped region. A warm follower prepares those slots after each of its full loads, and
its map's removals discard theirs, so a new term only adds slots for the regions the map
gained since, which it notes as they come (the million-slot table is built while
following, and no pass over every route is on the takeover path).
Dropping it hands the map back to the follower, which loads and follows it again. Its
objects live as long as the term, so they are moved out of the garbage collector's reach
(`gc.freeze`): full collections then do not walk a million routes while heartbeats wait.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable

from metasrv.errors import MetasrvError
from metasrv.leader._checkpoints import Checkpointer
from metasrv.leader._follower import MapFollower
from metasrv.leader._mailbox import Mailbox
from metasrv.leader._region_map import TopicRegionMap
from metasrv.leader._registry import RegionRegistry
from metasrv.model import RegionRoute
from metasrv.process import Backoff, Jitter

logger = logging.getLogger(__name__)

LOAD_RETRY = Backoff(base=0.25, cap=5.0, jitter=Jitter.NONE)
"""Waits between two attempts at loading the map (seconds): 0.25 doubling to 5."""


class LeaderView:
    """The topic-region map, the region stats, the mailbox and the dirty checkpoints."""

    def __init__(
        self,
        region_map: TopicRegionMap,
        registry: RegionRegistry,
        mailbox: Mailbox,
        checkpointer: Checkpointer,
        *,
        still_leading: Callable[[], bool],
        follower: MapFollower | None = None,
    ) -> None:
        self.region_map = region_map
        self.registry = registry
        self.mailbox = mailbox
        self.checkpointer = checkpointer
        self._still_leading = still_leading
        self.follower = follower
        """Keeps the map warm while this process follows (None: full loads only)."""
        if follower is not None:
            follower.loaded_listeners.append(self._prepare_table)
            region_map.apply_listeners.append(self._note_mapped)
        self._mapped_since: dict[int, str] | None = None
        """Region -> topic the followed map added since its full load prepared the table
        (None: no prepared table to add to, or this process leads)."""
        self.closed = False
        """Set on shutdown: a dropped view is not followed again."""

    async def load(self) -> bool:
        """Drop the old term's view and bring the map current; False if leadership went
        first."""
        self._forget_term(keep_prepared=True)
        follower = self.follower
        if follower is not None and await follower.take_over(self._still_leading):
            return self._ready()
        self.registry.clear()
        self._mapped_since = None
        self.region_map.unload()
        failures = 0
        while self._still_leading():
            try:
                await self.region_map.load()
            except MetasrvError as exc:
                logger.warning("loading the topic-region map failed", extra={"error": str(exc)})
                await asyncio.sleep(LOAD_RETRY.delay(failures))
                failures += 1
                continue
            return self._ready()
        return False

    async def drop(self) -> None:
        """Forget everything this term learned (DESIGN §2 invariant 3) and follow the map
        again."""
        self._forget_term()
        self.region_map.unload()
        gc.unfreeze()  # the old term's objects may be collected again
        if self.follower is not None and not self.closed:
            self.follower.start()

    def _ready(self) -> bool:
        self._add_slots()
        gc.freeze()
        return True

    def _add_slots(self) -> None:
        """Slots for the mapped regions that have none: all of them after a full load;
        at a warm take-over, those the followed map added since (still mapped to the
        topic they were added to), not a pass over every route (0.25 s at a million)."""
        self.registry.reserve(len(self.region_map))  # every mapped region reports soon
        mapped_since, self._mapped_since = self._mapped_since, None
        if mapped_since is None:
            self.registry.prepare(self.region_map.routed_by_topic().items())
            return
        routes = self.region_map.routes
        added: dict[str, list[int]] = {}
        for region_id, topic in mapped_since.items():
            route = routes.get(region_id)
            if route is not None and route.topic == topic:
                added.setdefault(topic, []).append(region_id)
        self.registry.prepare(added.items())

    def _prepare_table(self) -> None:
        """A fresh table with a slot for every region of the map just loaded (the
        follower's full loads, while this process does not lead)."""
        self.registry.clear()
        self._mapped_since = None
        self._add_slots()
        self._mapped_since = {}

    def _note_mapped(self, route: RegionRoute) -> None:
        if self._mapped_since is not None:
            self._mapped_since[route.region_id] = route.topic

    def _forget_term(self, *, keep_prepared: bool = False) -> None:
        """Forget the last term's stats, mailbox and dirty checkpoints; `keep_prepared`
        keeps a table that holds prepared slots only (no term has written to it)."""
        if not (keep_prepared and self.registry.untouched):
            self.registry.clear()
            self._mapped_since = None
        self.mailbox.clear()
        self.checkpointer.clear()
