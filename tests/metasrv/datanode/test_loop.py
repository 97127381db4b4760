"""The heartbeat loop's schedule and flush dispatch, driven by an in-memory `send` (the
real-metasrv runs are in test_client.py)."""

from __future__ import annotations

import itertools
import random
import threading
import time
from typing import Any

import pytest

from metasrv.datanode import Backoff, FlushInstructions, HeartbeatLoop
from metasrv.errors import NotLeader, Unavailable
from metasrv.wire import HeartbeatResponse, Instruction
from tests._wait import blocked_in, wait_until


def answer(*instructions: tuple[str, list[int]]) -> HeartbeatResponse:
    return HeartbeatResponse(
        leader="10.0.0.1:4000",
        instructions=[
            Instruction(id=i, kind="flush_regions", region_ids=r) for i, r in instructions
        ],
        rejected=[],
    )


def report() -> dict[str, Any]:
    return {"node_id": 1, "regions": []}


def test_an_instruction_repeated_in_every_answer_is_handed_over_once() -> None:
    flushed: list[tuple[int, ...]] = []
    answers = iter([answer(("a", [1, 2])), answer(("a", [1, 2]), ("b", [3])), answer(("b", [3]))])
    loop = HeartbeatLoop(lambda _body: next(answers), report, on_flush=flushed.append)
    for _ in range(3):
        loop.beat()
    assert flushed == [(1, 2), (3,)]


def test_the_remembered_ids_are_bounded() -> None:
    seen = FlushInstructions(remember=2)
    assert len(seen.fresh(answer(("a", [1]), ("b", [2]), ("c", [3])))) == 3
    assert [i.id for i in seen.fresh(answer(("a", [1]), ("c", [3])))] == ["a"]  # a forgotten


def test_failures_are_retried_after_jittered_backoff_then_the_interval_resumes() -> None:
    """Three failures, then answers: the waits after the failures come from the backoff
    windows 0.01, 0.02, 0.04 s (not the 0.5 s interval), and the failure count resets."""
    calls: list[float] = []
    failures = [Unavailable("refused"), NotLeader(None), Unavailable("loading")]
    done = threading.Event()

    def send(_body: object) -> HeartbeatResponse:
        calls.append(time.monotonic())
        if failures:
            raise failures.pop(0)
        if len(calls) >= 5:
            done.set()
        return answer()

    loop = HeartbeatLoop(
        send,
        report,
        interval=0.5,
        backoff=Backoff(base=0.01, cap=0.5),
        rng=random.Random(3),
        first_after=0.0,
    )
    loop.start()
    try:
        assert done.wait(5)
    finally:
        loop.stop()
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert all(g < 0.04 + 0.03 for g in gaps[:3]), gaps  # backoff windows, plus scheduling
    assert 0.25 - 0.01 <= gaps[3] < 0.75 + 0.05, gaps  # the first answer: a new phase
    assert (loop.errors, loop.failures, loop.sent) == (3, 0, 2)
    assert isinstance(loop.last_error, Unavailable)


def answer_any(_body: object) -> HeartbeatResponse:
    return answer()


def test_the_answer_after_failures_draws_a_new_phase_in_the_interval() -> None:
    """Datanodes that reached a new leader within one backoff window spread out again:
    the wait after the answer that ends their failures is uniform over one interval
    (from half to one and a half), the waits after later answers are the interval."""
    waits = []
    for seed in range(400):
        schedule = HeartbeatLoop(answer_any, report, interval=3.0, rng=random.Random(seed))
        schedule.failed(Unavailable("no leader"))
        waits.append(schedule.answered())
        assert schedule.answered() == 3.0
    assert all(1.5 <= w < 4.5 for w in waits), (min(waits), max(waits))
    # Uniform over the interval: each third of it holds about a third of the waits.
    thirds = [sum(1.5 + k <= w < 2.5 + k for w in waits) for k in range(3)]
    assert all(100 <= n <= 170 for n in thirds), thirds


def test_wake_sends_the_next_heartbeat_at_once() -> None:
    sent = threading.Event()

    def send(_body: object) -> HeartbeatResponse:
        sent.set()
        return answer()

    loop = HeartbeatLoop(send, report, interval=60.0)
    loop.start()
    try:
        thread = loop._thread
        assert thread is not None
        # Parked in the wait before its first heartbeat: nothing sent, and only a wake
        # can send one now.
        wait_until(lambda: blocked_in(thread, "run"), "the loop to wait for its first beat")
        assert not sent.is_set()
        started = time.monotonic()
        loop.wake()
        assert sent.wait(2)
        assert time.monotonic() - started < 1
    finally:
        loop.stop(timeout=5)


def test_a_bug_stops_the_loop_and_check_raises_it() -> None:
    def send(_body: object) -> HeartbeatResponse:
        raise KeyError("a bug in the report")

    loop = HeartbeatLoop(send, report, interval=0.01, first_after=0.0)
    loop.start()
    wait_until(lambda: not loop.alive, "the loop ended by the bug", timeout=5)
    with pytest.raises(KeyError):
        loop.check()
    loop.stop()
