"""The heartbeat loop: report, send, act on the answer, wait, again.

Every `interval` seconds the loop asks the database for its report (`report()`), sends it
(`send`, normally `DatanodeClient.heartbeat`), and hands each flush instruction it has not
seen before to `on_flush(region_ids)`. The flush's result needs no message of its own:
metasrv counts an instruction applied when a later report shows each region's
`flushed_entry_id` above the one it had when the instruction was sent (or an empty
memtable), so the next report carries it; `wake()` sends that report at once.

A failed heartbeat (no metasrv served it) is retried with a fresh report after capped
exponential backoff (`Backoff`: full jitter below the cap, a jittered period at it; the
cap defaults to half the interval, so a datanode reaches a new leader within half an
interval of its serving).

The answer that ends a run of failures is followed by a wait drawn uniformly from
`[interval/2, 3*interval/2)` instead of `interval`: a new phase in the interval, drawn
afresh. Every datanode that lost its leader reached the new one within one backoff
window, so without it their heartbeats would stay bunched in that window for good,
every round at twice the steady rate; the one longer wait is at most half an interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from typing import Final

import httpx

from metasrv import wire
from metasrv.datanode._body import Body
from metasrv.errors import MetasrvError
from metasrv.process import Backoff

logger = logging.getLogger(__name__)

FlushCallback = Callable[[tuple[int, ...]], object]
"""Called once per new `flush_regions` instruction with its region ids; it should hand
the flushes to the database's flush scheduler and return (the loop waits for it)."""
_REMEMBERED: Final = 4096


class FlushInstructions:
    """Each instruction once: metasrv repeats one on every answer until it sees it applied."""

    def __init__(self, remember: int = _REMEMBERED) -> None:
        self._seen: dict[str, None] = {}
        self._remember = remember

    def fresh(self, response: wire.HeartbeatResponse) -> list[wire.Instruction]:
        """The answer's `flush_regions` instructions not returned before."""
        new = []
        for instruction in response.instructions:
            if instruction.kind != "flush_regions" or instruction.id in self._seen:
                continue
            self._seen[instruction.id] = None
            new.append(instruction)
        while len(self._seen) > self._remember:
            del self._seen[next(iter(self._seen))]
        return new


class _Schedule:
    """Counters and the wait before the next heartbeat (shared by both loops)."""

    def __init__(self, interval: float, backoff: Backoff | None, rng: random.Random | None) -> None:
        self.interval = interval
        self.backoff = backoff or Backoff(base=min(0.1, interval / 2), cap=interval / 2)
        self.rng = rng or random.Random()
        self.sent = 0
        """Heartbeats a metasrv answered."""
        self.errors = 0
        """Failed heartbeats in total."""
        self.failures = 0
        """Failed heartbeats since the last answered one."""
        self.last_error: BaseException | None = None
        self.instructions = FlushInstructions()

    def answered(self) -> float:
        self.sent += 1
        recovered = self.failures > 0
        self.failures = 0
        if recovered:
            return self.interval * (0.5 + self.rng.random())  # a new phase (module doc)
        return self.interval

    def failed(self, exc: BaseException) -> float:
        delay = self.backoff.delay(self.failures, self.rng)
        self.failures += 1
        self.errors += 1
        self.last_error = exc
        logger.warning(
            "heartbeat failed (%s in a row), retrying in %.3fs: %s",
            self.failures,
            delay,
            exc,
            extra={"failures": self.failures, "delay": delay},
        )
        return delay

    def dispatch(
        self,
        response: wire.HeartbeatResponse,
        on_flush: FlushCallback | None,
    ) -> list[tuple[int, ...]]:
        batches = [tuple(i.region_ids) for i in self.instructions.fresh(response)]
        if on_flush is not None:
            for region_ids in batches:
                on_flush(region_ids)
        return batches


_RETRIED: Final = (MetasrvError, httpx.HTTPError)
"""What a heartbeat may fail with and be retried; anything else is a bug and stops the loop."""


class HeartbeatLoop(_Schedule):
    """Heartbeats on a thread of its own (`start`/`stop`), or on the caller's (`run`)."""

    def __init__(
        self,
        send: Callable[[Body], wire.HeartbeatResponse],
        report: Callable[[], Body],
        *,
        interval: float = 3.0,
        on_flush: FlushCallback | None = None,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        first_after: float | None = None,
        name: str = "metasrv-heartbeat",
    ) -> None:
        """`first_after`: seconds before the first heartbeat (default: `interval`)."""
        super().__init__(interval, backoff, rng)
        self._send = send
        self._report = report
        self._on_flush = on_flush
        self._first_after = interval if first_after is None else first_after
        self._name = name
        self._halt = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._fatal: BaseException | None = None

    def beat(self) -> wire.HeartbeatResponse:
        """One heartbeat now: report, send, hand new flush instructions to `on_flush`."""
        response = self._send(self._report())
        self.dispatch(response, self._on_flush)
        return response

    def run(self) -> None:
        """Heartbeat until `stop()`; raises what is not a metasrv or transport error."""
        delay = self._first_after
        while not self._halt.is_set():
            self._wake.wait(delay)
            self._wake.clear()
            if self._halt.is_set():
                return
            try:
                self.beat()
            except _RETRIED as exc:
                delay = self.failed(exc)
            else:
                delay = self.answered()

    def start(self) -> None:
        """Run on a daemon thread (idempotent while it runs)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._halt.clear()
        self._fatal = None
        self._thread = threading.Thread(target=self._guarded, name=self._name, daemon=True)
        self._thread.start()

    def _guarded(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # surfaced by check(): a dead loop must not go unseen
            logger.exception("the heartbeat loop died")
            self._fatal = exc

    @property
    def alive(self) -> bool:
        """True while the loop's thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def wake(self) -> None:
        """Send the next heartbeat now (e.g. once a flush finished)."""
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop and wait for its thread (a heartbeat in flight finishes first)."""
        self._halt.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None

    def check(self) -> None:
        """Raise the error that stopped the loop's thread, if any."""
        if self._fatal is not None:
            raise self._fatal


class AsyncHeartbeatLoop(_Schedule):
    """`HeartbeatLoop` for asyncio: `await loop.run()` in a task, `stop()` to end it."""

    def __init__(
        self,
        send: Callable[[Body], Awaitable[wire.HeartbeatResponse]],
        report: Callable[[], Body],
        *,
        interval: float = 3.0,
        on_flush: FlushCallback | None = None,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        first_after: float | None = None,
    ) -> None:
        super().__init__(interval, backoff, rng)
        self._send = send
        self._report = report
        self._on_flush = on_flush
        self._first_after = interval if first_after is None else first_after
        self._halt = asyncio.Event()
        self._wake = asyncio.Event()

    async def beat(self) -> wire.HeartbeatResponse:
        """One heartbeat now."""
        response = await self._send(self._report())
        self.dispatch(response, self._on_flush)
        return response

    async def run(self) -> None:
        """Heartbeat until `stop()`."""
        delay = self._first_after
        while not self._halt.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()
            if self._halt.is_set():
                return
            try:
                await self.beat()
            except _RETRIED as exc:
                delay = self.failed(exc)
            else:
                delay = self.answered()

    def wake(self) -> None:
        """Send the next heartbeat now."""
        self._wake.set()

    def stop(self) -> None:
        """End `run()` (after a heartbeat in flight)."""
        self._halt.set()
        self._wake.set()
