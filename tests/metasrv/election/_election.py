"""What the election tests share: the lease they run with and a listener recorder."""

from __future__ import annotations

from typing import TypeVar

from metasrv.election import Election

LEASE_SECS = 2

E = TypeVar("E", bound=Election)


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
