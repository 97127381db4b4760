"""Per-topic shared/exclusive locks held on the leader (DESIGN §2, invariant 4).

Registering a region takes its topic's shared (read) lock; a purge holds the exclusive
(write) lock from prepare to the end of purge. Only the leader registers regions and
runs procedures, so the lock lives in the leader's memory; a deposed leader is fenced
at commit time by the election key (see metasrv/election/), not by this lock.
Writers are preferred so a stream of registrations cannot starve a purge.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from metasrv.errors import LockNotAcquired


class _RwLock:
    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self.users = 0
        """Tasks holding or waiting for this lock (`TopicLocks` drops it at 0)."""

    async def acquire_read(self) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer and self._writers_waiting == 0)
            self._readers += 1

    async def release_read(self) -> None:
        async with self._cond:
            self._readers -= 1
            self._cond.notify_all()

    async def acquire_write(self) -> None:
        async with self._cond:
            self._writers_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._writer and self._readers == 0)
            except BaseException:
                # Gave up (timed out, cancelled): readers held back for this writer may
                # go now, or they would wait for an unrelated release.
                self._writers_waiting -= 1
                self._cond.notify_all()
                raise
            self._writers_waiting -= 1
            self._writer = True

    async def release_write(self) -> None:
        async with self._cond:
            self._writer = False
            self._cond.notify_all()


class TopicLocks:
    """Shared/exclusive locks keyed by topic name.

    A topic's lock object lives while any task holds it or waits for it (`_RwLock.users`),
    and is dropped only then: forgetting it as soon as it looked idle let a reader just
    woken by a writer's release take the old object while the next writer made a new
    one, and both held the topic at once.
    """

    def __init__(self) -> None:
        self._locks: dict[str, _RwLock] = {}

    def _enter(self, topic: str) -> _RwLock:
        lock = self._locks.get(topic)
        if lock is None:
            lock = self._locks[topic] = _RwLock()
        lock.users += 1
        return lock

    def _leave(self, topic: str, lock: _RwLock) -> None:
        lock.users -= 1
        if not lock.users and self._locks.get(topic) is lock:
            del self._locks[topic]

    @asynccontextmanager
    async def read(self, topic: str, timeout: float = 30.0) -> AsyncIterator[None]:
        """Hold `topic` shared; raise `LockNotAcquired` after `timeout` seconds."""
        lock = self._enter(topic)
        try:
            try:
                await asyncio.wait_for(lock.acquire_read(), timeout)
            except TimeoutError as exc:
                raise LockNotAcquired(
                    f"read lock on topic {topic} not acquired in {timeout}s"
                ) from exc
            try:
                yield
            finally:
                await lock.release_read()
        finally:
            self._leave(topic, lock)

    @asynccontextmanager
    async def write(self, topic: str, timeout: float = 30.0) -> AsyncIterator[None]:
        """Hold `topic` exclusively; raise `LockNotAcquired` after `timeout` seconds."""
        lock = self._enter(topic)
        try:
            try:
                await asyncio.wait_for(lock.acquire_write(), timeout)
            except TimeoutError as exc:
                raise LockNotAcquired(
                    f"write lock on topic {topic} not acquired in {timeout}s"
                ) from exc
            try:
                yield
            finally:
                await lock.release_write()
        finally:
            self._leave(topic, lock)

    def is_write_locked(self, topic: str) -> bool:
        """True while a purge holds the topic."""
        lock = self._locks.get(topic)
        return lock is not None and lock._writer
