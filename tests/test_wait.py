"""The polling helper: returns what the condition found, fails naming what it waited for."""

from __future__ import annotations

import itertools
import threading

import pytest

from tests._wait import blocked_in, eventually, wait_until, wait_until_or_none


def test_returns_the_first_true_value() -> None:
    counter = itertools.count()
    assert wait_until(lambda: max(0, next(counter) - 2), "the third poll") == 1


def test_times_out_naming_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the impossible \(last seen: 0\)"):
        wait_until(lambda: 0, "the impossible", timeout=0.05)


def test_ignored_errors_are_not_yet_and_are_reported() -> None:
    calls = itertools.count()

    def flaky() -> bool:
        if next(calls) < 2:
            raise ConnectionError("refused")
        return True

    assert wait_until(flaky, "a connection", ignore=(ConnectionError,))

    def refused() -> bool:
        raise ConnectionError("refused")

    with pytest.raises(AssertionError, match="last error: ConnectionError"):
        wait_until(refused, "a refused connection", timeout=0.05, ignore=(ConnectionError,))


def test_other_errors_propagate() -> None:
    with pytest.raises(ZeroDivisionError):
        wait_until(lambda: 1 // 0, "a division")


def test_an_opportunity_is_returned_or_none_once_the_time_is_up() -> None:
    counter = itertools.count()
    assert wait_until_or_none(lambda: max(0, next(counter) - 2), timeout=5) == 1
    assert wait_until_or_none(lambda: [], timeout=0.05) is None

    def refused() -> bool:
        raise ConnectionError("refused")

    assert wait_until_or_none(refused, timeout=0.05, ignore=(ConnectionError,)) is None
    with pytest.raises(ZeroDivisionError):
        wait_until_or_none(lambda: 1 // 0, timeout=5)


def test_blocked_in_sees_a_thread_parked_in_a_wait_of_the_named_function() -> None:
    gate = threading.Event()
    spinning = threading.Event()

    def parked() -> None:
        gate.wait(30)

    def busy() -> None:
        while not gate.is_set():
            spinning.set()

    waiter = threading.Thread(target=parked)
    spinner = threading.Thread(target=busy)
    waiter.start()
    spinner.start()
    try:
        assert wait_until(lambda: blocked_in(waiter, "parked"), "the waiter to park")
        assert not blocked_in(waiter, "busy")
        assert spinning.wait(5) and not blocked_in(spinner, "busy")
    finally:
        gate.set()
        waiter.join(5)
        spinner.join(5)
    assert not blocked_in(waiter, "parked")


async def test_eventually_takes_plain_and_async_conditions() -> None:
    polls = itertools.count()

    async def third() -> bool:
        return next(polls) >= 2

    assert await eventually(third, "the third async poll")
    assert await eventually(lambda: "yes", "a plain value") == "yes"
    with pytest.raises(AssertionError, match="waiting for never"):
        await eventually(lambda: None, "never", timeout=0.05)
