"""Per-topic locks (DESIGN §2 invariant 4): a registration (shared) and a purge (exclusive)
never hold one topic at once, in interleavings driven step by step on one event loop."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager

import pytest

from metasrv.errors import LockNotAcquired
from metasrv.leader import TopicLocks
from tests._wait import eventually

TOPIC = "t"


def _waiting(locks: TopicLocks, topic: str) -> int:
    """Tasks waiting on the topic's current lock object (asyncio.Condition waiters)."""
    lock = locks._locks.get(topic)
    return 0 if lock is None else len(lock._cond._waiters)


class Holders:
    """Who holds the topic now; every entry that finds another holder is recorded."""

    def __init__(self) -> None:
        self.now: set[str] = set()
        self.overlaps: list[tuple[str, frozenset[str]]] = []
        self.entered: dict[str, asyncio.Event] = {}
        self.go: dict[str, asyncio.Event] = {}

    def start(self, name: str, lock: AbstractAsyncContextManager[None]) -> asyncio.Task[None]:
        self.entered[name] = asyncio.Event()
        self.go[name] = asyncio.Event()

        async def hold() -> None:
            async with lock:
                if self.now:
                    self.overlaps.append((name, frozenset(self.now)))
                self.now.add(name)
                self.entered[name].set()
                await self.go[name].wait()
                self.now.discard(name)

        return asyncio.create_task(hold(), name=name)


async def test_a_reader_woken_by_a_purges_release_and_the_next_purge_never_overlap() -> None:
    locks = TopicLocks()
    h = Holders()
    purge = h.start("purge", locks.write(TOPIC))
    await h.entered["purge"].wait()
    registration = h.start("registration", locks.read(TOPIC))
    await eventually(lambda: _waiting(locks, TOPIC) == 1, "the registration waits for the purge")

    h.go["purge"].set()  # the purge ends: its release wakes the waiting registration
    await purge
    next_purge = h.start("next purge", locks.write(TOPIC))
    # One of the two gets the topic; the other is then in it too, or waits for it.
    await eventually(
        lambda: (
            (h.entered["registration"].is_set() or h.entered["next purge"].is_set())
            and (
                (h.entered["registration"].is_set() and h.entered["next purge"].is_set())
                or _waiting(locks, TOPIC) == 1
            )
        ),
        "both tried the topic",
    )
    assert h.overlaps == []
    h.go["registration"].set()
    h.go["next purge"].set()
    await asyncio.gather(registration, next_purge)
    assert h.overlaps == []
    assert locks._locks == {}  # nothing held or awaited: no lock object kept


async def test_a_purge_and_registrations_interleaved_in_every_order_never_overlap() -> None:
    # Purges and registrations started in turns, each released as soon as it holds the
    # topic, with the loop run between every two steps: the topic is only ever held by
    # several registrations or by one purge.
    locks = TopicLocks()
    h = Holders()
    tasks: list[asyncio.Task[None]] = []
    order = ["w", "r", "w", "r", "r", "w", "r", "w", "w", "r"]
    for i, kind in enumerate(order):
        name = f"{kind}{i}"
        lock = locks.write(TOPIC) if kind == "w" else locks.read(TOPIC)
        tasks.append(h.start(name, lock))
        for _ in range(i % 3):
            await asyncio.sleep(0)  # one loop step: the interleaving under test
        for held in list(h.now):
            h.go[held].set()
    for event in h.go.values():
        event.set()
    await asyncio.gather(*tasks)
    writers = {n for n in h.entered if n.startswith("w")}
    assert [(n, o) for n, o in h.overlaps if n in writers or o & writers] == []
    assert locks._locks == {}


async def test_a_purge_that_gives_up_lets_waiting_registrations_in() -> None:
    locks = TopicLocks()
    h = Holders()
    reader = h.start("registration", locks.read(TOPIC))
    await h.entered["registration"].wait()
    impatient = asyncio.create_task(_write_with_timeout(locks, 0.2))
    await eventually(lambda: _waiting(locks, TOPIC) == 1, "the purge waits")
    late = h.start("late registration", locks.read(TOPIC))  # held back for the purge
    await eventually(lambda: _waiting(locks, TOPIC) == 2, "the late registration waits")
    with pytest.raises(LockNotAcquired):
        await impatient
    # Without a wake-up at the purge's timeout it would wait for an unrelated release.
    await asyncio.wait_for(h.entered["late registration"].wait(), 2.0)
    h.go["registration"].set()
    h.go["late registration"].set()
    await asyncio.gather(reader, late)
    assert locks._locks == {}


async def _write_with_timeout(locks: TopicLocks, timeout: float) -> None:
    async with locks.write(TOPIC, timeout=timeout):
        raise AssertionError("the purge got the topic while a registration held it")
