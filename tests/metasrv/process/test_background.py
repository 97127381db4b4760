"""Background-task failures: counted per task, logged, and a dead task named."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry, Counter

from metasrv.errors import KvUnavailable
from metasrv.process import BackgroundTasks


def _tasks() -> tuple[BackgroundTasks, CollectorRegistry]:
    registry = CollectorRegistry()
    errors = Counter("metasrv_background_task_errors", "", ["task"], registry=registry)
    return BackgroundTasks(errors), registry


def _count(registry: CollectorRegistry, task: str) -> float:
    value = registry.get_sample_value("metasrv_background_task_errors_total", {"task": task})
    return 0.0 if value is None else value


def test_failed_rounds_are_counted_per_task_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    tasks, registry = _tasks()
    sink = tasks.sink("ticker")
    sink(KvUnavailable("etcd down"))
    sink(OverflowError("int too big to convert"))
    tasks.failed("checkpointer", RuntimeError("boom"))
    assert _count(registry, "ticker") == 2
    assert _count(registry, "checkpointer") == 1
    # A dependency being down is a warning; anything else an error with its traceback.
    levels = [(r.levelno, r.exc_info is not None) for r in caplog.records]
    assert levels == [(logging.WARNING, False), (logging.ERROR, True), (logging.ERROR, True)]
    assert tasks.dead() == []  # failed rounds do not kill a task


async def test_a_task_that_dies_is_named_and_one_stopped_on_request_is_not() -> None:
    tasks, registry = _tasks()

    async def dies() -> None:
        raise OverflowError("value too large for int64")

    async def runs() -> None:
        await asyncio.sleep(3600)

    async def returns() -> None:
        return None

    dead, cancelled, finished = (asyncio.create_task(c()) for c in (dies, runs, returns))
    tasks.watch("stat_history", dead)
    tasks.watch("ticker", cancelled)
    tasks.watch("checkpointer", finished)
    tasks.watch("loop_lag", None)  # a task that was never started is not watched
    cancelled.cancel()
    await asyncio.wait({dead, cancelled, finished})
    await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    assert tasks.dead() == ["stat_history"]
    assert _count(registry, "stat_history") == 1
    assert _count(registry, "ticker") == 0
