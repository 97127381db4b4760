"""The process's background loops on real etcd, Kafka and SQLite: started in one place,
drained in reverse order (the writers while this process still leads, then it resigns),
and a second close does nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from api.runtime import Runtime
from metasrv.keys import ELECTION_KEY
from metasrv.kv import EtcdKv
from metasrv.process import Supervised
from tests._wait import eventually
from tests.api.conftest import SettingsFactory


async def test_close_drains_the_writers_while_leading_then_resigns_once(
    make_settings: SettingsFactory, etcd: EtcdKv, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = Runtime.build(make_settings())
    stopped: list[tuple[str, bool]] = []
    """(loop, whether this process still led when its stop began), in stop order."""

    def noting(name: str, stop: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        async def stop_noted() -> None:
            stopped.append((name, runtime.election.is_leader))
            await stop()

        return stop_noted

    writers: list[tuple[str, Supervised]] = [
        ("ticker", runtime.ticker),
        ("procedure_sweeper", runtime.procedures),
        ("checkpointer", runtime.checkpointer),
    ]
    for name, loop in writers:
        monkeypatch.setattr(loop, "stop", noting(name, loop.stop))
    monkeypatch.setattr(runtime.election, "stop", noting("election", runtime.election.stop))
    try:
        await runtime.start()
        await eventually(lambda: runtime.serving, "the runtime serving as leader")
        assert etcd.get(ELECTION_KEY) is not None
        assert runtime.background.names == [
            "loop_lag",
            "gc_pacer",
            "map_follower",
            "election",
            "checkpointer",
            "wal_events",
            "procedure_sweeper",
            "event_retention",
            "wal_trend",
            "ticker",
            "stat_history",
        ]
        running = [runtime.ticker.task, runtime.checkpointer.task, runtime.loop_lag.task]
        assert all(task is not None and not task.done() for task in running)
    finally:
        await runtime.close()
    assert stopped == [
        ("ticker", True),
        ("procedure_sweeper", True),
        ("checkpointer", True),  # its last flush carries the fence of a live term
        ("election", True),
    ]
    assert etcd.get(ELECTION_KEY) is None  # resigned: a successor need not wait the TTL
    assert all(task is not None and task.done() for task in running)
    assert runtime.background.dead() == []  # stopped on request, not dead
    await runtime.close()  # repeat-safe: nothing stops twice
    assert len(stopped) == 4
