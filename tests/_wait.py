"""Waiting for something to happen: poll a condition until it holds or a deadline passes.

The one way a test waits for an outcome. A test never sleeps for a fixed time to let something
happen; it names the state it expects and waits for it here (`wait_until`, `eventually` on the
event loop; `wait_until_or_none` for an opportunity the test may also do without). An absence
("X did not happen") is checked after an event that proves the system had the chance, not
after a pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

TIMEOUT = 30.0
"""Seconds before a wait fails: generous, since the machine running the suite may be loaded."""
INTERVAL = 0.02
"""Seconds between two polls: short enough that a test waits little more than it must."""


class _Poll:
    """One wait's deadline and what its last poll saw."""

    def __init__(self, what: str, timeout: float) -> None:
        self.what, self.timeout = what, timeout
        self.deadline = time.monotonic() + timeout

    def done(self, value: object, error: Exception | None) -> bool:
        """True when `value` ends the wait; raise once the deadline has passed."""
        if error is None and value:
            return True
        if time.monotonic() > self.deadline:
            seen = f"last error: {error!r}" if error is not None else f"last seen: {value!r}"
            raise AssertionError(
                f"timed out after {self.timeout:g}s waiting for {self.what} ({seen})"
            ) from error
        return False


def wait_until(
    cond: Callable[[], T | None],
    what: str,
    *,
    timeout: float = TIMEOUT,
    interval: float = INTERVAL,
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """Call `cond` until it returns a true value, and return that value.

    Raise AssertionError naming `what` (and the last value or error seen) when `timeout`
    seconds pass first. Exceptions of the types in `ignore` count as "not yet".
    """
    poll = _Poll(what, timeout)
    while True:
        error: Exception | None = None
        value: T | None = None
        try:
            value = cond()
        except ignore as exc:
            error = exc
        if poll.done(value, error) and value is not None:
            return value
        time.sleep(interval)


def wait_until_or_none(
    cond: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = INTERVAL,
    ignore: tuple[type[Exception], ...] = (),
) -> T | None:
    """`wait_until` for an opportunity rather than an outcome: the first true value `cond`
    returns within `timeout` seconds, or None once they have passed.

    For a test that would rather act while something is under way (inject a fault in the
    middle of a purge) and acts anyway when nothing came; what a test must see happen it
    waits for with `wait_until`. Exceptions of the types in `ignore` count as "not yet".
    """
    deadline = time.monotonic() + timeout
    while True:
        value: T | None = None
        with contextlib.suppress(*ignore):
            value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def blocked_in(thread: threading.Thread, function: str) -> bool:
    """True while `thread` is parked in a blocking wait (`threading`'s lock, event, condition
    or queue waits) that `function` called, directly or not.

    The condition a test polls before it interrupts a blocking call the product makes on a
    thread of its own ("the watch is now inside `next`, waiting"), when nothing else tells.
    """
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None or frame.f_code.co_name != "wait":
        return False
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


@overload
async def eventually(
    cond: Callable[[], Awaitable[T | None]],
    what: str,
    *,
    timeout: float = ...,
    interval: float = ...,
    ignore: tuple[type[Exception], ...] = ...,
) -> T: ...
@overload
async def eventually(
    cond: Callable[[], T | None],
    what: str,
    *,
    timeout: float = ...,
    interval: float = ...,
    ignore: tuple[type[Exception], ...] = ...,
) -> T: ...
async def eventually(
    cond: Callable[[], Any],
    what: str,
    *,
    timeout: float = TIMEOUT,
    interval: float = INTERVAL,
    ignore: tuple[type[Exception], ...] = (),
) -> Any:
    """`wait_until` for a test on the event loop: `cond` may be a plain or an async function,
    and the loop runs the system under test between two polls."""
    poll = _Poll(what, timeout)
    while True:
        error: Exception | None = None
        value: Any = None
        try:
            result = cond()
            value = await result if inspect.isawaitable(result) else result
        except ignore as exc:
            error = exc
        if poll.done(value, error):
            return value
        await asyncio.sleep(interval)
