"""The supervisor: failed rounds counted per loop and logged, a dead loop named, the drain
ordered and repeat-safe; and the ticker every periodic loop runs on."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry, Counter

from metasrv.errors import KvUnavailable
from metasrv.process import PeriodicLoop, Step, Supervisor
from tests._wait import eventually


def _supervisor() -> tuple[Supervisor, CollectorRegistry]:
    registry = CollectorRegistry()
    errors = Counter("metasrv_background_task_errors", "", ["task"], registry=registry)
    return Supervisor(errors), registry


def _count(registry: CollectorRegistry, task: str) -> float:
    value = registry.get_sample_value("metasrv_background_task_errors_total", {"task": task})
    return 0.0 if value is None else value


class _Rounds(PeriodicLoop):
    """Counts its rounds; raises from a round, or dies outside one, when told to."""

    task_name = "rounds"

    def __init__(self, *, fail_rounds: int = 0, die_after: int | None = None) -> None:
        super().__init__()
        self.rounds = 0
        self.fail_rounds = fail_rounds
        self.die_after = die_after
        self.ran = asyncio.Event()

    def next_round_in(self) -> float | None:
        if self.die_after is not None and self.rounds >= self.die_after:
            raise OverflowError("value too large for int64")
        return 0.001

    async def round(self) -> None:
        self.rounds += 1
        if self.rounds >= 3:
            self.ran.set()
        if self.rounds <= self.fail_rounds:
            raise KvUnavailable("etcd down")


def test_failed_rounds_are_counted_per_task_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    loops, registry = _supervisor()
    sink = loops.sink("ticker")
    sink(KvUnavailable("etcd down"))
    sink(OverflowError("int too big to convert"))
    loops.failed("checkpointer", RuntimeError("boom"))
    assert _count(registry, "ticker") == 2
    assert _count(registry, "checkpointer") == 1
    # A dependency being down is a warning; anything else an error with its traceback.
    levels = [(r.levelno, r.exc_info is not None) for r in caplog.records]
    assert levels == [(logging.WARNING, False), (logging.ERROR, True), (logging.ERROR, True)]
    assert loops.dead() == []  # failed rounds do not kill a task


async def test_a_loop_goes_on_after_failed_rounds_and_one_that_dies_is_named() -> None:
    loops, registry = _supervisor()
    survivor = _Rounds(fail_rounds=2)
    survivor.on_error = loops.sink("survivor")
    dies = _Rounds(die_after=1)
    loops.add("survivor", survivor)
    loops.add("dies", dies)
    await loops.start()
    await asyncio.wait_for(survivor.ran.wait(), 5)
    await eventually(lambda: loops.dead() == ["dies"], "the dead loop named")
    assert _count(registry, "dies") == 1
    assert _count(registry, "survivor") == 2  # its two failed rounds; it still runs
    assert survivor.task is not None and not survivor.task.done()
    await loops.stop()
    assert loops.dead() == ["dies"]  # a stop on request is no death
    assert _count(registry, "survivor") == 2


async def test_a_task_that_dies_is_named_and_one_stopped_on_request_is_not() -> None:
    loops, registry = _supervisor()

    async def dies() -> None:
        raise OverflowError("value too large for int64")

    async def runs() -> None:
        await asyncio.sleep(3600)

    async def returns() -> None:
        return None

    dead, cancelled, finished = (asyncio.create_task(c()) for c in (dies, runs, returns))
    loops.watch("stat_history", dead)
    loops.watch("ticker", cancelled)
    loops.watch("checkpointer", finished)
    loops.watch("loop_lag", None)  # a task that was never started is not watched
    cancelled.cancel()
    await asyncio.wait({dead, cancelled, finished})
    await eventually(lambda: loops.dead() == ["stat_history"], "the dead task named")
    assert _count(registry, "stat_history") == 1
    assert _count(registry, "ticker") == 0


def _recording(log: list[str], name: str, *, fail_stop: bool = False) -> Step:
    async def start() -> None:
        log.append(f"start {name}")

    async def stop() -> None:
        log.append(f"stop {name}")
        if fail_stop:
            raise RuntimeError(f"{name} would not stop")

    return Step(start, stop)


async def test_the_drain_runs_in_reverse_start_order_once_even_when_a_stop_fails() -> None:
    loops, _ = _supervisor()
    log: list[str] = []
    for name in ("lag", "election", "checkpointer", "ticker"):
        loops.add(name, _recording(log, name, fail_stop=name == "checkpointer"))
    async with loops:
        assert log == ["start lag", "start election", "start checkpointer", "start ticker"]
    assert log[4:] == ["stop ticker", "stop checkpointer", "stop election", "stop lag"]
    await loops.stop()  # repeat-safe: nothing stops twice
    assert len(log) == 8


async def test_a_member_that_fails_to_start_stops_those_started_before_it() -> None:
    loops, _ = _supervisor()
    log: list[str] = []

    async def refuses() -> None:
        raise KvUnavailable("etcd down")

    loops.add("lag", _recording(log, "lag"))
    loops.add("election", _recording(log, "election"))
    loops.add("checkpointer", Step(refuses, _recording(log, "never").stop))
    loops.add("ticker", _recording(log, "ticker"))
    with pytest.raises(KvUnavailable):
        await loops.start()
    assert log == ["start lag", "start election", "stop election", "stop lag"]


async def test_a_step_s_task_is_watched_once_it_started() -> None:
    # The election is a step (it campaigns on a thread); its listeners' task is watched.
    loops, registry = _supervisor()
    started: list[asyncio.Task[None]] = []

    async def delivers_leadership() -> None:
        raise OverflowError("a listener queue bug")

    async def start() -> None:
        started.append(asyncio.create_task(delivers_leadership()))

    async def stop() -> None:
        await asyncio.wait(started)

    loops.add("election", Step(start, stop, lambda: started[0] if started else None))
    async with loops:
        await eventually(lambda: loops.dead() == ["election"], "the election named dead")
    assert _count(registry, "election") == 1


def test_two_loops_under_one_name_are_refused() -> None:
    loops, _ = _supervisor()
    loops.add("ticker", _Rounds())
    with pytest.raises(ValueError, match="ticker"):
        loops.add("ticker", _Rounds())


async def test_stop_waits_out_a_round_within_its_grace_then_runs_drained() -> None:
    class Slow(PeriodicLoop):
        stop_grace = 5.0
        round_first = True

        def __init__(self) -> None:
            super().__init__()
            self.entered = asyncio.Event()
            self.finished_round = False
            self.drained_after_round: bool | None = None

        def next_round_in(self) -> float | None:
            return None

        async def round(self) -> None:
            self.entered.set()
            await asyncio.sleep(0.05)  # the round's own work, which `stop` lets finish
            self.finished_round = True

        async def drained(self) -> None:
            self.drained_after_round = self.finished_round

    loop = Slow()
    await loop.start()
    await asyncio.wait_for(loop.entered.wait(), 5)
    await loop.stop()
    assert loop.drained_after_round is True
    await loop.stop()  # repeat-safe
    assert loop.task is None


async def test_wake_starts_the_next_round_at_once() -> None:
    loop = _Rounds()
    loop.next_round_in = lambda: None  # type: ignore[method-assign]  # only a wake runs one
    async with loop:
        for expected in (1, 2):
            loop.wake()
            await eventually(lambda: loop.rounds >= expected, f"round {expected}")  # noqa: B023
        assert loop.rounds == 2
