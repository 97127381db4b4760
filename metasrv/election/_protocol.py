"""What every election offers: who leads, its term, its address, leadership listeners and the
fence a leader-only write carries."""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from metasrv.election._lease import Listener
from metasrv.kv import Compare


@runtime_checkable
class Election(Protocol):
    """Who leads; built by `build_election`."""

    @property
    def is_leader(self) -> bool:
        """True while this process leads (and its lease is fresh)."""
        ...

    @property
    def term(self) -> int:
        """Term of the current leader as known here (etcd lease id); 0 when unknown."""
        ...

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task a supervisor watches while started: it ends with the error that stopped
        the election's work (campaigning and renewing, or delivering leadership changes
        to the listeners), either of which would leave the process deaf to elections."""
        ...

    async def start(self) -> None:
        """Begin campaigning (returns at once; leadership arrives via listeners)."""
        ...

    async def stop(self) -> None:
        """Resign (revoke the lease) and stop campaigning; safe to call twice."""
        ...

    def leader_addr(self) -> str | None:
        """HTTP address of the current leader (own address when leading), if known."""
        ...

    def add_listener(self, callback: Listener) -> None:
        """Call `callback(True)` on gaining and `callback(False)` on losing leadership."""
        ...

    def fence(self) -> list[Compare]:
        """Kv compares that hold only while this process is still the leader."""
        ...
