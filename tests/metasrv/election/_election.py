"""What the election tests share: the lease they run with, polling, and a listener recorder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from metasrv.election import Election

LEASE_SECS = 2

E = TypeVar("E", bound=Election)


async def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `cond` until true; return the seconds it took."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


class Recorder:
    """An election listener that records what it was told."""

    def __init__(self) -> None:
        self.events: list[bool] = []

    async def __call__(self, leader: bool) -> None:
        self.events.append(leader)


def leader_of(pair: tuple[E, E]) -> tuple[E, E]:
    """(leader, follower) of a pair with exactly one leader."""
    a, b = pair
    assert a.is_leader != b.is_leader
    return (a, b) if a.is_leader else (b, a)
