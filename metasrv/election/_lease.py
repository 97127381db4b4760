"""The election thread shared by every store: campaign, keep the lease, step down.

`LeaseElection` runs campaigning and renewals on a thread of its own, over a store
connection of its own, doing nothing but blocking store calls, so a busy event loop, a
full default thread pool or a slow Kafka call cannot delay a renewal. That is why the
keepalive is not a `PeriodicLoop` like the process's other loops: a round on the event
loop runs only when the loop gets to it, and a renewal that waits for a stalled loop
lets the lease lapse under a leader that is still working. The supervisor still owns
it: `start`/`stop` are its member's, and `task` (on the loop) ends with whatever ended
the thread or the listeners, so a dead election is reported like a dead loop. A watchdog stops
renewing (and resigns) once the event loop has not run for `watchdog_secs` (3x the
lease by default); a process that is gone or frozen (SIGKILL, SIGSTOP) renews nothing
and loses the lease. A renewal that fails in transit is retried while the lease may
still be alive. Subclasses supply the store calls: `_read_holder`, `_acquire`,
`_renew_lease`, `_release`, and the connection's `_open`/`_close`.

The leader's value (`{"node", "addr", "term"}`, JSON) is what every leader-only kv
write compares against (`fence`): it names the term, so it matches only this process's
current term.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypedDict

from metasrv.errors import KvUnavailable
from metasrv.keys import ELECTION_KEY, ElectionValue, decode_election, encode_election
from metasrv.kv import Compare

logger = logging.getLogger(__name__)

_RENEW_RETRY = 0.2
"""Seconds between retries of a keepalive that failed in transit."""

Listener = Callable[[bool], Awaitable[None]]
"""Called with True when this process gains leadership, False when it loses it."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """Outcome of one `_acquire`."""

    won: bool
    term: int = 0
    """Our new term, when won."""
    value: bytes = b""
    """Our value when won; else the holder's (empty when unknown)."""
    since: float = 0.0
    """Monotonic time the new lease's TTL counts from (taken before the store call)."""


class Listeners:
    """Listener callbacks, run in order on a queue so slow ones never delay keepalives."""

    def __init__(self) -> None:
        self._callbacks: list[Listener] = []
        self._queue: asyncio.Queue[bool] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task that calls the listeners, while started."""
        return self._task

    def add(self, callback: Listener) -> None:
        self._callbacks.append(callback)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="election-listeners")

    def notify(self, leader: bool) -> None:
        self._queue.put_nowait(leader)

    async def _run(self) -> None:
        while True:
            leader = await self._queue.get()
            await self._call_all(leader)
            self._queue.task_done()

    async def _call_all(self, leader: bool) -> None:
        for callback in list(self._callbacks):
            try:
                await callback(leader)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("election listener failed", extra={"leader": leader})

    async def drain_and_stop(self) -> None:
        """Deliver what is queued, then stop."""
        if self._task is None:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout=30)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None


class LeaseOptions(TypedDict, total=False):
    """How a `LeaseElection` keeps its lease; the backends pass these through."""

    lease_secs: int
    poll_interval: float
    loop_stalled_for: Callable[[], float] | None
    watchdog_secs: float | None


class LeaseElection:
    """Campaign and lease keeping on a dedicated thread (see the module docstring)."""

    def __init__(
        self,
        *,
        node_name: str,
        addr: str,
        lease_secs: int = 5,
        poll_interval: float = 0.5,
        loop_stalled_for: Callable[[], float] | None = None,
        watchdog_secs: float | None = None,
    ) -> None:
        self.node_name = node_name
        self.addr = addr
        self.lease_secs = lease_secs
        self.poll_interval = poll_interval
        self.watchdog_secs = 3.0 * lease_secs if watchdog_secs is None else watchdog_secs
        """Seconds without an event-loop tick after which the leader stops renewing."""
        self._loop_stalled_for = loop_stalled_for
        # Keepalive cadence: three renewals per TTL, each with a deadline short enough
        # that two failed renewals are noticed well before the lease could expire.
        self._renew_every = lease_secs / 3
        self._rpc_timeout = max(0.5, lease_secs / 3)
        self._listeners = Listeners()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._thread_ended: asyncio.Future[None] | None = None
        """Set on the event loop when the election thread has ended (with its error)."""
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = threading.Event()
        # Written by the election thread, read anywhere: each is one atomic attribute store.
        self._leader = False
        self._term = 0
        self._value = b""
        self._deadline = 0.0  # monotonic time after which our lease may have expired
        self._leader_addr: str | None = None
        self._leader_term = 0

    # --- store calls (blocking, on the election thread) ---------------------------------

    def _open(self) -> None:
        """Open this election's own store connection (on the event loop, before the thread)."""

    def _close(self) -> None:
        """Close it (after the thread ended)."""

    def _read_holder(self) -> bytes | None:
        """The current leader's value while its lease lives, else None."""
        raise NotImplementedError

    def _acquire(self) -> Attempt:
        """Try to take the free lease with `_value_for(term)`."""
        raise NotImplementedError

    def _renew_lease(self) -> str | None:
        """Renew our lease once and move `_deadline`; the reason to step down, or None.
        Raises `KvUnavailable` when the store did not answer."""
        raise NotImplementedError

    def _release(self) -> None:
        """Give up our lease at once (quietly: it ends by itself anyway)."""
        raise NotImplementedError

    # --- public API ------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leader and time.monotonic() < self._deadline

    @property
    def term(self) -> int:
        return self._term if self._leader else self._leader_term

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task a supervisor watches, while started: it ends with the error that ended
        the election thread or the listeners' task (neither ends otherwise until `stop`)."""
        return self._watcher

    @property
    def lease_deadline(self) -> float:
        """Monotonic time until which this process's lease surely lives (0 when it does not
        lead); every renewal moves it on."""
        return self._deadline

    def leader_addr(self) -> str | None:
        if self._leader:
            # Past our deadline and not yet stepped down: the successor is not known yet.
            return self.addr if self.is_leader else None
        return self._leader_addr

    def add_listener(self, callback: Listener) -> None:
        self._listeners.add(callback)

    def fence(self) -> list[Compare]:
        # Our value embeds our term, so it matches only our own, current term;
        # before the first win it is a value no election key ever holds.
        return [Compare(ELECTION_KEY, value=self._value or b"\0not-leader")]

    async def start(self) -> None:
        if self._thread is not None:
            return
        loop = self._loop = asyncio.get_running_loop()
        self._listeners.start()
        self._stopping.clear()
        self._open()
        ended = self._thread_ended = loop.create_future()
        self._thread = threading.Thread(
            target=self._thread_main, args=(loop, ended), name="metasrv-election", daemon=True
        )
        self._thread.start()
        self._watcher = asyncio.create_task(self._watch(ended), name="election")

    async def stop(self) -> None:
        """Resign (the thread releases the lease on its way out) and stop campaigning."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        ended, self._thread_ended = self._thread_ended, None
        if thread is not None and ended is not None:
            # Its longest wait is one store call's deadline; the thread reports its end on
            # the loop, so no pool thread waits for it.
            await asyncio.wait({ended})
        watcher, self._watcher = self._watcher, None
        await self._listeners.drain_and_stop()
        if watcher is not None:
            await asyncio.wait({watcher})
        with contextlib.suppress(Exception):
            self._close()

    async def _watch(self, thread_ended: asyncio.Future[None]) -> None:
        """Wait for the thread or the listeners to end; raise what ended them."""
        listeners = self._listeners.task
        watched: set[asyncio.Future[None]] = {thread_ended}
        if listeners is not None:
            watched.add(listeners)
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        for ended in watched:
            if ended.done() and not ended.cancelled() and (exc := ended.exception()) is not None:
                raise exc

    # --- the election thread ------------------------------------------------------

    def _value_for(self, term: int) -> bytes:
        return encode_election(ElectionValue(self.node_name, self.addr, term))

    def _thread_main(self, loop: asyncio.AbstractEventLoop, ended: asyncio.Future[None]) -> None:
        """The thread's body: `_run`, then its end reported on `loop`. An error that ends
        the thread (a bug: `_run` retries every `Exception` of a round) goes there too, to
        end `task` with it: the supervisor logs and reports it once."""
        error: BaseException | None = None
        try:
            self._run()
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(_settle, ended, error)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    if self._campaign():
                        self._lead()
                    else:
                        self._stopping.wait(self.poll_interval)
                except Exception as exc:
                    # KvUnavailable mostly; keep campaigning once the store answers again.
                    logger.warning("election: %s", exc)
                    if self._leader:
                        self._step_down(f"error: {exc}")
                    self._stopping.wait(self.poll_interval)
        finally:
            if self._leader:
                self._step_down("resigned")

    def _stalled(self) -> float | None:
        """Seconds the event loop has not run, when past the watchdog bound; else None."""
        if self._loop_stalled_for is None:
            return None
        stalled = self._loop_stalled_for()
        return stalled if stalled > self.watchdog_secs else None

    def _campaign(self) -> bool:
        """Observe the holder; when the lease is free, try to take it. True when we won."""
        holder = self._read_holder()
        if holder is not None:
            self._observe(holder)
            return False
        if self._stalled() is not None or self._stopping.is_set():
            return False  # a wedged (or stopping) process must not take over
        attempt = self._acquire()
        if not attempt.won:
            if attempt.value:
                self._observe(attempt.value)
            return False
        self._term, self._value = attempt.term, attempt.value
        self._deadline = attempt.since + self.lease_secs
        self._leader_addr, self._leader_term = self.addr, attempt.term
        self._leader = True
        logger.info(
            "elected leader",
            extra={"node": self.node_name, "term": attempt.term, "addr": self.addr},
        )
        self._notify(True)
        return True

    def _lead(self) -> None:
        """Keep the lease alive; return after stepping down or on stop.

        A renewal that fails in transit (timeout, connection reset) is retried while the
        lease may still be alive: one slow store answer must not cost the cluster its
        leader. `is_leader` turns False by itself at the deadline whatever happens here.
        """
        wait = self._renew_every
        while self._leader and not self._stopping.wait(wait):
            try:
                reason = self._renew()
            except KvUnavailable as exc:
                if time.monotonic() < self._deadline:
                    logger.warning("election: keepalive failed, retrying: %s", exc)
                    wait = _RENEW_RETRY
                    continue
                reason = f"keepalive failed until the lease ran out: {exc}"
            wait = self._renew_every
            if reason is not None:
                self._step_down(reason)
                return

    def _renew(self) -> str | None:
        stalled = self._stalled()
        if stalled is not None:
            return f"event loop has not run for {stalled:.1f}s (watchdog {self.watchdog_secs:g}s)"
        return self._renew_lease()

    def _step_down(self, reason: str) -> None:
        if not self._leader:
            return
        self._leader = False
        self._deadline = 0.0
        self._leader_addr = None
        logger.warning(
            "leadership lost",
            extra={"node": self.node_name, "term": self._term, "reason": reason},
        )
        self._notify(False)
        # Free the lease at once so a successor need not wait the TTL.
        self._release()

    def _notify(self, leader: bool) -> None:
        """Queue the listeners' call on the event loop (they are coroutines of the loop)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._listeners.notify, leader)

    def _observe(self, value: bytes) -> None:
        try:
            info = decode_election(value)
            self._leader_addr, self._leader_term = info.addr, info.term
        except ValueError:
            logger.warning("election key holds an unreadable value: %r", value[:200])
            self._leader_addr, self._leader_term = None, 0


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
