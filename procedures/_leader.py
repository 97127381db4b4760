"""The election as procedures see it (metasrv/election/ implements it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from metasrv.kv import Compare


class LeaderFence(Protocol):
    @property
    def is_leader(self) -> bool: ...

    def fence(self) -> list[Compare]:
        """Kv compares that hold only while this process leads (added to every write)."""
        ...

    def leader_addr(self) -> str | None:
        """HTTP address of the current leader, if known (for `NotLeader`)."""
        ...

    def add_listener(self, listener: Callable[[bool], Awaitable[None]]) -> None:
        """Call `listener(is_leader)` on every leadership change, in the order added."""
        ...
