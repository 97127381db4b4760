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
are collected here too, on a fixed schedule, since the allocation trigger that would
start them no longer fires. The interpreter's own thresholds stay as a backstop.
"""

from __future__ import annotations

import gc

from metasrv.process._periodic import PeriodicLoop

DEFAULT_INTERVAL = 0.05
"""Seconds between two young-generation collections."""
MIDDLE_EVERY = 40
"""Every 40th pass (2 s at the default interval) collects generation 1 as well."""
FULL_EVERY = 1200
"""Every 1,200th pass (1 minute) is a full collection: what lives that long is mostly the
leader's own state, frozen out of reach when leadership began, so a full pass is short,
but it still costs more than a young one, so it is rare."""


class GcPacer(PeriodicLoop):
    """Collects from the event loop every `interval`: generation 0 each time, 1 and 2
    every `MIDDLE_EVERY` and `FULL_EVERY` passes."""

    task_name = "gc-pacer"

    def __init__(self, interval: float = DEFAULT_INTERVAL) -> None:
        super().__init__()
        self.interval = interval
        self.passes = 0

    def collect(self) -> int:
        """One pass; returns the objects collected."""
        self.passes += 1
        if self.passes % FULL_EVERY == 0:
            return gc.collect(2)
        if self.passes % MIDDLE_EVERY == 0:
            return gc.collect(1)
        return gc.collect(0)

    def next_round_in(self) -> float:
        return self.interval

    async def round(self) -> None:
        self.collect()
