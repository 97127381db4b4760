"""The one ticker: a background loop that runs a round every so often on one task.

A subclass sets `task_name` and implements `round` (one pass of its work) and
`next_round_in` (seconds until the next round, read before each wait, so a loop can change its pace:
the purge ticker looks more often while a new term's first round is due; None waits for
`wake` or `stop` alone). What a round raises goes to `on_error` (the supervisor's sink:
logged and counted) and the loop goes on; a bug outside the round ends the task, which
the supervisor reports as dead.

Lifecycle: `start` (a no-op when disabled or running; `launch` is the same for plain
code), `stop` (repeat-safe: sets the shutdown event, lets a round in progress finish for
`stop_grace` seconds, then cancels it, then runs `drained`), `async with`, and `task`
for the supervisor to watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Self

from metasrv.process._supervisor import ErrorSink, log_only


class PeriodicLoop:
    """Subclasses set `task_name`, implement `round` and `next_round_in`, and call
    `super().__init__()`; see the module docstring."""

    task_name = "periodic"
    round_first = False
    """True: a round at start, before the first wait (else the loop waits first)."""
    stop_grace = 0.0
    """Seconds `stop` lets a round in progress finish before cancelling it (`math.inf`:
    never cancel: the round ends itself once it sees `stopping`)."""
    error_pause = 0.0
    """Seconds to wait (or until `stop`) after a round failed, before the next wait."""

    def __init__(self, on_error: ErrorSink | None = None) -> None:
        self._shutdown = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.on_error: ErrorSink = on_error or log_only(self.task_name)
        """Called with what a round raised."""

    @property
    def enabled(self) -> bool:
        return True

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The running loop, if started."""
        return self._task

    @property
    def stopping(self) -> bool:
        """True from `stop` on (a long round checks it to end early)."""
        return self._shutdown.is_set()

    def next_round_in(self) -> float | None:
        """Seconds until the next round; None: until `wake`."""
        raise NotImplementedError

    async def round(self) -> None:
        """One round of the loop's work."""
        raise NotImplementedError

    async def drained(self) -> None:
        """Runs in `stop` once the task has ended (a last write, a reset)."""

    def wake(self) -> None:
        """End the current wait now: the next round starts at once."""
        self._wake.set()

    async def pause(self, seconds: float | None) -> bool:
        """Wait `seconds` (None: for ever), ending early on `wake` or `stop`; True when
        stopping."""
        if not self._shutdown.is_set() and (seconds is None or seconds > 0):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()
        return self._shutdown.is_set()

    async def sleep(self, seconds: float) -> bool:
        """Wait `seconds`, ending early only on `stop` (not on `wake`); True when
        stopping."""
        if not self._shutdown.is_set() and seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._shutdown.wait(), seconds)
        return self._shutdown.is_set()

    async def _run(self) -> None:
        if self.round_first:
            await self._round()
        while not await self.pause(self.next_round_in()):
            await self._round()

    async def _round(self) -> None:
        try:
            await self.round()
        except Exception as exc:
            self.on_error(exc)
            await self.sleep(self.error_pause)

    def launch(self) -> None:
        """`start` for a caller that is not a coroutine (starting needs no await)."""
        if self._task is not None or not self.enabled:
            return
        self._shutdown.clear()
        self._wake.clear()
        self._task = asyncio.create_task(self._run(), name=self.task_name)

    async def start(self) -> None:
        """Start the loop (no-op when disabled or already running)."""
        self.launch()

    async def stop(self) -> None:
        """Stop the loop, wait for it, then `drained`; safe to call more than once."""
        self._shutdown.set()
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            if self.stop_grace > 0:
                grace = None if math.isinf(self.stop_grace) else self.stop_grace
                await asyncio.wait({task}, timeout=grace)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})
        await self.drained()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
