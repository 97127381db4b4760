"""Failures of the process's background loops: logged, counted, and visible in /readyz.

Each loop (purge ticker, checkpointer, stat history writer, procedure sweeper, loop-lag
probe) catches what one round raises and hands it to `BackgroundTasks.failed`, which logs
it and counts it in `metasrv_background_task_errors_total{task}`; the loop then goes on
with its next round. A loop whose task ends with an exception anyway (a bug outside the
round) is recorded as dead by `watch`, counted the same way, and `dead()` names it so
`/readyz` answers not ready instead of the process silently running without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prometheus_client import Counter

from metasrv.errors import MetasrvError

logger = logging.getLogger(__name__)

ErrorSink = Callable[[BaseException], None]
"""What a loop calls with the exception one of its rounds raised."""


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel a background loop and wait until it has ended (None: nothing to do)."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def log_only(task: str) -> ErrorSink:
    """A sink for a loop used without a runtime (tools, tests): it only logs."""
    return lambda exc: _log(task, exc)


def _log(task: str, exc: BaseException) -> None:
    if isinstance(exc, MetasrvError):
        # Expected when a dependency is down (kv, Kafka, SQL): the next round retries.
        logger.warning("%s round failed: %s", task, exc, extra={"task": task})
    else:
        logger.error("%s round failed", task, exc_info=exc, extra={"task": task})


class BackgroundTasks:
    """The failure counter and the watched tasks of one process."""

    def __init__(self, errors: Counter) -> None:
        self._errors = errors
        self._watched: dict[str, asyncio.Task[None]] = {}
        self._dead: dict[str, str] = {}

    def failed(self, task: str, exc: BaseException) -> None:
        """One round of `task` failed: log it and count it."""
        _log(task, exc)
        self._errors.labels(task=task).inc()

    def sink(self, task: str) -> ErrorSink:
        """`failed` bound to one task name, for the loop's constructor."""
        return lambda exc: self.failed(task, exc)

    def watch(self, task: str, running: asyncio.Task[None] | None) -> None:
        """Report `running` as dead if it ever ends with an exception."""
        if running is None:
            return
        self._watched[task] = running
        self._dead.pop(task, None)
        running.add_done_callback(lambda done: self._ended(task, done))

    def _ended(self, task: str, done: asyncio.Task[None]) -> None:
        if self._watched.get(task) is done:
            del self._watched[task]
        if done.cancelled() or done.exception() is None:
            return  # stopped on request
        exc = done.exception()
        assert exc is not None
        logger.error("background task %s died", task, exc_info=exc, extra={"task": task})
        self._errors.labels(task=task).inc()
        self._dead[task] = f"{type(exc).__name__}: {exc}"

    def dead(self) -> list[str]:
        """Names of the watched tasks that ended with an exception, sorted."""
        return sorted(self._dead)
