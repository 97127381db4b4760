"""The leadership state machine's ordering rules, on an election double (pure logic).

The daemon's real-election behaviour (a follower answers 421, a new leader 503 until its
map is loaded, procedures resume after the map) is tested end to end in
tests/api/test_failover.py and tests/procedures/wal_purge/test_wal_purge.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from metasrv.election import Listener
from metasrv.errors import NotLeader, Unavailable
from metasrv.kv import Compare
from metasrv.leader import Leadership, Role
from tests._wait import eventually


class _Election:
    """Just enough of `Election` to drive listeners by hand."""

    def __init__(self) -> None:
        self.is_leader = False
        self.term = 0
        self.task: asyncio.Task[None] | None = None
        self._listeners: list[Listener] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def leader_addr(self) -> str | None:
        return "other:1" if not self.is_leader else "me:1"

    def add_listener(self, callback: Listener) -> None:
        self._listeners.append(callback)

    def fence(self) -> list[Compare]:
        return []

    async def change(self, leader: bool) -> None:
        self.is_leader = leader
        for callback in self._listeners:
            await callback(leader)


def _recording(
    log: list[str], name: str, *, done: bool = True
) -> tuple[Callable[[], Awaitable[bool]], Callable[[], Awaitable[None]]]:
    async def start() -> bool:
        log.append(f"start {name}")
        return done

    async def stop() -> None:
        log.append(f"stop {name}")

    return start, stop


async def test_hooks_start_in_order_and_stop_in_reverse() -> None:
    election, log = _Election(), list[str]()
    roles: list[Role] = []
    leadership = Leadership(election, on_role=roles.append)
    for name in ("view", "procedures", "pool"):
        leadership.add_hook(name, *_recording(log, name))
    await leadership.start()
    with pytest.raises(NotLeader):
        leadership.require_serving()

    await election.change(True)
    assert leadership.serving and leadership.role is Role.LEADER
    leadership.require_serving()
    await election.change(False)

    assert log == [
        "start view",
        "start procedures",
        "start pool",
        "stop pool",
        "stop procedures",
        "stop view",
    ]
    assert roles == [Role.ELECTED, Role.LEADER, Role.FOLLOWER]
    assert not leadership.serving


async def test_no_serving_until_every_start_hook_is_done() -> None:
    election = _Election()
    gate = asyncio.Event()
    leadership = Leadership(election)

    async def slow_load() -> bool:
        await gate.wait()
        return True

    async def drop() -> None: ...

    leadership.add_hook("view", slow_load, drop)
    await leadership.start()
    change = asyncio.create_task(election.change(True))
    await eventually(lambda: leadership.role is Role.ELECTED, "elected, the view loading")
    with pytest.raises(Unavailable):
        leadership.require_serving()
    gate.set()
    await change
    leadership.require_serving()


async def test_a_start_hook_that_gives_up_stops_what_started_and_skips_the_rest() -> None:
    election, log = _Election(), list[str]()
    leadership = Leadership(election)
    leadership.add_hook("view", *_recording(log, "view"))
    leadership.add_hook("procedures", *_recording(log, "procedures", done=False))
    leadership.add_hook("pool", *_recording(log, "pool"))
    await leadership.start()
    await election.change(True)
    assert log == ["start view", "start procedures", "stop procedures", "stop view"]
    assert leadership.role is Role.FOLLOWER


async def test_a_second_election_drops_the_first_terms_work_first() -> None:
    election, log = _Election(), list[str]()
    leadership = Leadership(election)
    leadership.add_hook("view", *_recording(log, "view"))
    await leadership.start()
    await election.change(True)
    await election.change(True)  # a new term without a loss seen in between
    assert log == ["start view", "stop view", "start view"]
    await leadership.close()
    assert log[-1] == "stop view" and leadership.role is Role.FOLLOWER
