"""How late the event loop runs: a probe every few milliseconds, exported as a histogram.

A timer that should fire after `interval` fires `interval + lag` later; the lag is how
long something else held the loop (CPU work, a GC pause, a big encode). The probe also
records when the loop last ran it, so a thread that must not trust a wedged loop (the
election's watchdog) can ask `stalled_for()` without touching the loop.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import Histogram

from metasrv.process._periodic import PeriodicLoop

DEFAULT_INTERVAL = 0.025
"""Seconds between probes: fine enough to see a 20 ms stall, cheap enough to run always."""


class LoopLagMonitor(PeriodicLoop):
    """Measures event-loop lag into `histogram` (see the module docstring)."""

    task_name = "loop-lag"

    def __init__(self, histogram: Histogram | None = None, interval: float = DEFAULT_INTERVAL):
        super().__init__()
        self.interval = interval
        self._histogram = histogram
        self._last_tick = 0.0
        self._max_lag = 0.0

    @property
    def max_lag(self) -> float:
        """The longest lag seen since start, in seconds."""
        return self._max_lag

    def stalled_for(self) -> float:
        """Seconds since the loop last ran the probe (0 before `start`); safe from any thread."""
        last = self._last_tick
        return 0.0 if last == 0.0 else max(0.0, time.monotonic() - last)

    async def start(self) -> None:
        if self.task is None:
            self._last_tick = time.monotonic()
        await super().start()

    async def drained(self) -> None:
        self._last_tick = 0.0

    async def _run(self) -> None:
        # The probe is the one loop that is not a round on the ticker's wait: its wait is
        # what it measures, so it is a bare sleep, nothing else on the path.
        interval = self.interval
        observe = self._histogram.observe if self._histogram is not None else None
        while True:
            before = time.monotonic()
            await asyncio.sleep(interval)
            now = time.monotonic()
            self._last_tick = now
            lag = max(0.0, now - before - interval)
            if lag > self._max_lag:
                self._max_lag = lag
            if observe is not None:
                observe(lag)
