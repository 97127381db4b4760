"""The process's background loops on real etcd, Kafka and SQLite: started in one place,
drained in reverse order (the writers while this process still leads, then it resigns),
a second close does nothing; a loop that dies is named by readiness while the others run
on; and a new term's first purge round waits for the term's reports, not the interval."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import pytest

from api import queries
from api.runtime import Runtime
from metasrv.keys import ELECTION_KEY
from metasrv.kv import EtcdKv
from metasrv.process import Supervised
from tests._metrics import sample
from tests._wait import eventually, wait_until
from tests.api.conftest import SettingsFactory, heartbeat, region, start_server


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
            "archive_retention",
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


def test_a_new_terms_first_purge_round_runs_once_every_mapped_region_reported(
    make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # An hour-long interval: the round comes from the reports the runtime's Term counts.
    settings = make_settings(wal={"auto_prune_interval": "1h"})
    with start_server(settings) as srv, srv.client() as client:
        topics = [
            client.post("/v1/regions", json={"region_id": r, "node_id": 1}).json()["topic"]
            for r in (1, 2)
        ]
    caplog.set_level(logging.INFO, logger="procedures.wal_purge._ticker")

    def first_rounds() -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.getMessage().startswith("first purge round of the term")
            and r.__dict__["regions"] == 2
        ]

    with start_server(settings) as srv, srv.client() as client:  # a new term, 2 regions
        reports = [region(1, topics[0], 0), region(2, topics[1], 0)]
        assert client.post("/v1/heartbeat", json=heartbeat(1, reports)).status_code == 200
        [line] = wait_until(first_rounds, "the term's first purge round")
    assert line.__dict__["after_s"] < 60  # not the hour


async def test_a_loop_that_dies_is_named_by_readiness_and_the_others_run_on(
    make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = Runtime.build(make_settings())
    sampled = 0

    def dies_after_a_round() -> float:
        nonlocal sampled
        sampled += 1
        if sampled > 1:
            raise OverflowError("a bug outside the round")  # not a failed round: a death
        return 0.05

    monkeypatch.setattr(runtime.wal_trend, "next_round_in", dies_after_a_round)
    try:
        await runtime.start()
        await eventually(lambda: runtime.background.dead() == ["wal_trend"], "wal_trend dead")
        checks = await queries.readiness(runtime)
        assert checks["background_tasks"] == "dead: wal_trend"
        assert {k: v for k, v in checks.items() if k != "background_tasks"} == {
            "kv": "ok",
            "kafka": "ok",
            "history": "ok",
        }
        running = [runtime.ticker.task, runtime.checkpointer.task, runtime.procedures.task]
        assert all(task is not None and not task.done() for task in running)
        errors = {"task": "wal_trend"}
        assert sample(runtime.metrics, "metasrv_background_task_errors_total", errors) == 1
    finally:
        await runtime.close()
