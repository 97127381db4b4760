"""The one owner of a process's background work (temporalio's `Worker` shape).

Every loop of the process is registered once, in start order (`add`); `start` starts them
in that order and `stop` drains them in the reverse one, each once, whatever happens: a
stop that fails is logged and the drain goes on, and a second `stop` does nothing (it is
safe to call from a lifespan's `finally` and again from a signal handler). A member that
fails to start stops the ones already started, then the error propagates.

Failures are reported in one place, at two grains:

- a round that raises (a dependency down, a bug in one round): the loop hands it to
  `failed` (through `sink(name)`), which logs it (a `MetasrvError` as a warning, anything
  else as an error with its traceback) and counts it in
  `metasrv_background_task_errors_total{task}`; the loop goes on with its next round;
- a loop whose task ends with an exception (a bug outside its round): recorded as dead,
  logged, counted the same way, and `dead()` names it, so `/readyz` answers 503 naming
  the loop.

The policy for a dead loop is to report it and keep the process running, without a
restart: leadership and heartbeats do not depend on any one background loop, a loop that
died of a bug would most likely die again, and an orchestrator acting on `/readyz`
(or the operator, paged by the error log) decides. Nothing is restarted behind the
operator's back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, Self

from prometheus_client import Counter

from metasrv.errors import MetasrvError

logger = logging.getLogger(__name__)

ErrorSink = Callable[[BaseException], None]
"""What a loop calls with the exception one of its rounds raised."""


class Supervised(Protocol):
    """A background loop: started and stopped by its supervisor; `task` is watched."""

    @property
    def task(self) -> asyncio.Task[None] | None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def _no_task() -> asyncio.Task[None] | None:
    return None


@dataclass(frozen=True, slots=True)
class Step:
    """A member that is not one loop (campaigning, writing the last events): what its
    start and its stop do, and the task to watch once it started, if any."""

    on_start: Callable[[], Awaitable[None]]
    on_stop: Callable[[], Awaitable[None]]
    watched: Callable[[], asyncio.Task[None] | None] = _no_task

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self.watched()

    async def start(self) -> None:
        await self.on_start()

    async def stop(self) -> None:
        await self.on_stop()


async def nothing() -> None:
    """A `Step` side with nothing to do."""


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel a task and wait until it has ended (None: nothing to do)."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def log_only(task: str) -> ErrorSink:
    """A sink for a loop used without a supervisor (tools, tests): it only logs."""
    return lambda exc: _log(task, exc)


def _log(task: str, exc: BaseException) -> None:
    if isinstance(exc, MetasrvError):
        # Expected when a dependency is down (kv, Kafka, SQL): the next round retries.
        logger.warning("%s round failed: %s", task, exc, extra={"task": task})
    else:
        logger.error("%s round failed", task, exc_info=exc, extra={"task": task})


@dataclass(frozen=True, slots=True)
class _Member:
    name: str
    member: Supervised
    watched: bool


class Supervisor:
    """Starts, watches and drains the background loops of one process (module docstring)."""

    def __init__(self, errors: Counter) -> None:
        """`errors` is `metasrv_background_task_errors` (labelled by task)."""
        self._errors = errors
        self._members: list[_Member] = []
        self._started: list[_Member] = []
        self._watched: dict[str, asyncio.Task[None]] = {}
        self._dead: dict[str, str] = {}

    def add(self, name: str, member: Supervised, *, watch: bool = True) -> None:
        """Register `member` to start after those added before it and stop before them.
        `watch=False`: its task's end is not a death (a loop whose health readiness
        reports otherwise, like the map follower's)."""
        if any(m.name == name for m in self._members):
            raise ValueError(f"a background loop named {name!r} is registered already")
        self._members.append(_Member(name, member, watch))

    @property
    def names(self) -> list[str]:
        """The members in start order."""
        return [m.name for m in self._members]

    async def start(self) -> None:
        """Start every member not started yet, in order, watching each one's task."""
        for entry in self._members:
            if entry in self._started:
                continue
            try:
                await entry.member.start()
            except BaseException:
                logger.error("background loop %s did not start", entry.name)
                await self.stop()
                raise
            self._started.append(entry)
            if entry.watched:
                self.watch(entry.name, entry.member.task)

    async def stop(self) -> None:
        """Stop the started members in reverse start order; repeat-safe. A stop that
        raises is logged and the rest still stop."""
        while self._started:
            entry = self._started.pop()
            try:
                await entry.member.stop()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("stopping %s failed", entry.name, extra={"task": entry.name})

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- failures ---------------------------------------------------------------------

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
