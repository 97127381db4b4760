"""What becoming and stopping being the leader means, as one explicit state machine.

    FOLLOWER --elected--> ELECTED --every start hook done--> LEADER
        ^                    |                                  |
        +------ lost (or the election moved on meanwhile) ------+

`Leadership` is the one listener of the election. The work a leadership change does is a
list of hooks registered once, at wiring time, in the order they must run
(`add_hook(name, on_start, on_stop)`): on election every `on_start` runs in that order,
and only when all of them are done does the process serve (`serving`, `require_serving`);
on loss, or when the election moved on while a hook ran, the `on_stop` of every hook
that started runs in reverse order. An `on_start` that cannot finish returns False
(it gave up because leadership was lost): later hooks are not started.

Dropping every view of the old term before a new one starts is DESIGN §2 invariant 3:
stats, instructions and dirty checkpoints of another term are never reused.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from metasrv.election import Election
from metasrv.errors import NotLeader, Unavailable

logger = logging.getLogger(__name__)

StartHook = Callable[[], Awaitable[bool]]
"""Runs on election; True when done, False when it gave up (leadership lost meanwhile)."""
StopHook = Callable[[], Awaitable[None]]
"""Runs on loss of leadership, for a hook whose start ran."""


class Role(enum.Enum):
    FOLLOWER = "follower"
    ELECTED = "elected"
    """Elected; the start hooks run (the map loads): not serving yet."""
    LEADER = "leader"
    """Every start hook done: serving heartbeats and writes."""


@dataclass(frozen=True)
class _Hook:
    name: str
    on_start: StartHook
    on_stop: StopHook


class Leadership:
    """The process's role, moved by the election through the registered hooks."""

    def __init__(
        self, election: Election, *, on_role: Callable[[Role], None] | None = None
    ) -> None:
        self._election = election
        self._on_role = on_role
        self._hooks: list[_Hook] = []
        self._started: list[_Hook] = []
        self._lock = asyncio.Lock()
        self._closed = False
        self.role = Role.FOLLOWER

    def add_hook(self, name: str, on_start: StartHook, on_stop: StopHook) -> None:
        """Register one piece of leader work; hooks start in registration order."""
        self._hooks.append(_Hook(name, on_start, on_stop))

    @property
    def serving(self) -> bool:
        """True while this process leads and every start hook is done."""
        return self.role is Role.LEADER and self._election.is_leader

    def require_serving(self) -> None:
        """Raise `NotLeader` (421) on a follower, `Unavailable` (503) while starting."""
        if not self._election.is_leader:
            raise NotLeader(self._election.leader_addr())
        if self.role is not Role.LEADER:
            raise Unavailable("this metasrv just became leader and is loading the topic-region map")

    async def start(self) -> None:
        """Follow the election (call before the election starts campaigning)."""
        self._election.add_listener(self._changed)
        if self._election.is_leader:
            await self._changed(True)

    async def close(self) -> None:
        """Run the stop hooks of a leader that is shutting down; repeat-safe."""
        self._closed = True
        async with self._lock:
            await self._stop_all()

    async def _changed(self, leader: bool) -> None:
        async with self._lock:
            await self._stop_all()
            if not leader or self._closed or not self._election.is_leader:
                if not leader:
                    logger.info("lost leadership")
                return
            self._set(Role.ELECTED)
            for hook in self._hooks:
                self._started.append(hook)
                done = await hook.on_start()
                if not done or self._closed or not self._election.is_leader:
                    logger.info("leadership lost while starting", extra={"hook": hook.name})
                    await self._stop_all()
                    return
            self._set(Role.LEADER)
            logger.info("serving as leader")

    async def _stop_all(self) -> None:
        if self.role is not Role.FOLLOWER:
            self._set(Role.FOLLOWER)
        while self._started:
            hook = self._started.pop()
            try:
                await hook.on_stop()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("leader stop hook failed", extra={"hook": hook.name})

    def _set(self, role: Role) -> None:
        self.role = role
        if self._on_role is not None:
            self._on_role(role)
