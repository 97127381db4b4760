"""Young-generation garbage collection in small, frequent steps on the event loop.

CPython starts a generation-0 collection when allocations minus deallocations of
tracked objects pass a threshold. The leader mostly *replaces* objects: a heartbeat's
row tuple replaces the region's previous row, a checkpoint's route replaces the
previous route. So the net count barely moves while the young generation grows to
hundreds of thousands of objects, and the collection that finally runs walks them all
at once, with every thread stopped: 130-360 ms under `benchmarks/load.py` at 100k
regions, each one a stall of the event loop and a tail of heartbeat latency.

Collecting the young generation every `interval` instead keeps each pass to what was
made in that interval (a few milliseconds at 33k region stats/s). The older generations
are collected here too, when their counts say they are due, so nothing waits for an
allocation to trigger them. The interpreter's own thresholds stay as a backstop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc

DEFAULT_INTERVAL = 0.05
"""Seconds between two young-generation collections."""


class GcPacer:
    """Runs `gc.collect(0)` every `interval` (gen 1 or 2 when due) from the event loop."""

    def __init__(self, interval: float = DEFAULT_INTERVAL) -> None:
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gc-pacer")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            collect_due()


def collect_due() -> int:
    """Collect the oldest generation whose count has reached its threshold, else gen 0.

    `gc.collect(n)` adds one to generation n+1's count, as an automatic collection does,
    so the older generations come due at the interpreter's usual ratios.
    """
    _, threshold1, threshold2 = gc.get_threshold()
    _, count1, count2 = gc.get_count()
    if count2 >= threshold2:
        return gc.collect(2)
    if count1 >= threshold1:
        return gc.collect(1)
    return gc.collect(0)
