"""The lifecycle of a background loop: `start` (a no-op when disabled or running), `stop`
(repeat-safe), `async with`, and the task for `BackgroundTasks.watch`."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Self


class PeriodicLoop:
    """Subclasses set `task_name`, implement `enabled` and `_run` (which returns when
    `_shutdown` is set), and call `super().__init__()`."""

    task_name = "periodic"

    def __init__(self) -> None:
        self._shutdown = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return True

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The running loop, if started."""
        return self._task

    async def _run(self) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        """Start the loop (no-op when disabled or already running)."""
        if self._task is not None or not self.enabled:
            return
        self._shutdown.clear()
        self._task = asyncio.create_task(self._run(), name=self.task_name)

    async def stop(self) -> None:
        """Stop the loop and wait for it; safe to call more than once."""
        self._shutdown.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
