"""The leader's view of the regions, started and dropped as one unit by `Leadership`.

Starting it drops whatever an earlier term left, then loads the topic-region map (retrying
while this process still leads) and reserves a stat slot for every mapped region. Its
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
from metasrv.leader._mailbox import Mailbox
from metasrv.leader._region_map import TopicRegionMap
from metasrv.leader._registry import RegionRegistry

logger = logging.getLogger(__name__)

LOAD_RETRY_MAX = 5.0
"""Longest wait between two attempts at loading the map (seconds)."""


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
    ) -> None:
        self.region_map = region_map
        self.registry = registry
        self.mailbox = mailbox
        self.checkpointer = checkpointer
        self._still_leading = still_leading

    async def load(self) -> bool:
        """Drop the old term's view and load the map; False if leadership went first."""
        await self.drop()
        delay = 0.25
        while self._still_leading():
            try:
                regions = await self.region_map.load()
            except MetasrvError as exc:
                logger.warning("loading the topic-region map failed", extra={"error": str(exc)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, LOAD_RETRY_MAX)
                continue
            self.registry.reserve(regions)  # every mapped region reports soon
            gc.freeze()
            return True
        return False

    async def drop(self) -> None:
        """Forget everything this term learned (DESIGN §2 invariant 3)."""
        self.registry.clear()
        self.mailbox.clear()
        self.checkpointer.clear()
        self.region_map.unload()
        gc.unfreeze()  # the old term's objects may be collected again
