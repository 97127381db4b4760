"""WAL events, written off the procedures' path, and their retention.

`EventLog.emit` never waits and never raises: an event goes into a bounded in-memory
queue (one deque append) and one background task writes what has queued meanwhile in one
transaction. A write that fails is tried again 0.2 s and then 1 s later; after that the
batch is dropped, logged and counted in `metasrv_wal_events_dropped_total{reason=
"write_failed"}`. When the queue holds `capacity` events (the history database is down,
or slower than events arrive) the oldest is dropped for each new one (reason
`overflow`). So a purge never waits for the history database, nor fails on it, because
of its events; the metrics and logs that go with an event (data loss) do not depend on it.

`flush()` waits until everything emitted before it is written or dropped: the API calls
it before it reads events, so the leader answers with the events of a procedure it has
seen end, and shutdown calls it before the engine closes.

`EventRetention` is the leader's loop that deletes events older than
`history.events_retention`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Collection
from datetime import UTC, datetime

from prometheus_client import Counter

from metasrv.process import ErrorSink, PeriodicLoop, log_only
from metasrv.wire import WalEvent
from procedures._history import History

logger = logging.getLogger(__name__)

CAPACITY = 10_000
"""Most events held in memory waiting for the history database."""
BATCH = 1_000
"""Most events written in one transaction."""
RETRY_DELAYS = (0.2, 1.0)
"""Seconds before each further try of a failed write."""


class EventLog:
    """Queues WAL events and writes them to the SQL history in the background."""

    def __init__(
        self,
        history: History,
        dropped: Counter | None = None,
        *,
        capacity: int = CAPACITY,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
    ) -> None:
        """`dropped` is `metasrv_wal_events_dropped` (labelled by reason), if counted."""
        self.history = history
        self._dropped = dropped
        self._capacity = capacity
        self._retry_delays = retry_delays
        self._pending: deque[WalEvent] = deque()
        self._drainer: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        """Events emitted and not yet written (nor dropped)."""
        return len(self._pending)

    def emit(self, event: WalEvent) -> None:
        """Queue `event` for writing; returns at once and never raises."""
        try:
            if len(self._pending) >= self._capacity:
                self._pending.popleft()
                self._drop(1, "overflow")
            self._pending.append(event)
            self._start_drain()
        except Exception:
            logger.exception("could not queue a WAL event", extra={"kind": event.kind})

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event emitted so far is written or dropped; False when
        `timeout` seconds passed first."""
        self._start_drain()
        task = self._drainer
        if task is None or task.done():
            return True
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            return False
        return True

    async def read(
        self,
        *,
        topic: str | None = None,
        kinds: Collection[str] = (),
        since: datetime | None = None,
        limit: int = 100,
        flush_timeout: float = 2.0,
    ) -> list[WalEvent]:
        """`History.events`, after what this process emitted is written (for at most
        `flush_timeout` seconds: a reader is not held up by a slow database for long)."""
        await self.flush(flush_timeout)
        return await self.history.events(topic=topic, kinds=kinds, since=since, limit=limit)

    def _start_drain(self) -> None:
        if not self._pending or (self._drainer is not None and not self._drainer.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop in this thread: the next emit or flush inside one writes them
        self._drainer = loop.create_task(self._drain(), name="wal-events")

    async def _drain(self) -> None:
        while self._pending:
            batch = [self._pending.popleft() for _ in range(min(BATCH, len(self._pending)))]
            await self._write(batch)

    async def _write(self, batch: list[WalEvent]) -> None:
        error: Exception | None = None
        for delay in (0.0, *self._retry_delays):
            if delay:
                await asyncio.sleep(delay)
            try:
                await self.history.record_events(batch)
                return
            except Exception as exc:  # the database, or a bug: never the emitter's problem
                error = exc
        logger.warning(
            "dropped %d WAL events: the history database did not take them: %s",
            len(batch),
            error,
            extra={"kinds": sorted({e.kind for e in batch})},
        )
        self._drop(len(batch), "write_failed")

    def _drop(self, count: int, reason: str) -> None:
        if self._dropped is not None:
            self._dropped.labels(reason=reason).inc(count)


def trim_interval(retention: float) -> float:
    """Seconds between two trims: a quarter of the retention, between 1 s and 1 h."""
    return min(3600.0, max(1.0, retention / 4))


class EventRetention(PeriodicLoop):
    """Deletes events older than `retention` seconds, every `interval`, while `leading()`.

    A loop on the ticker (`PeriodicLoop`), a trim at start. A retention of 0 keeps
    events for good (the loop does not start). Every replica runs the loop; only the
    leader deletes, so one process works on the shared table at a time.
    """

    task_name = "event-retention"
    round_first = True

    def __init__(
        self,
        history: History,
        retention: float,
        *,
        leading: Callable[[], bool],
        interval: float | None = None,
        on_error: ErrorSink | None = None,
    ) -> None:
        super().__init__(on_error or log_only("event_retention"))
        self.history = history
        self.retention = retention
        self.interval = trim_interval(retention) if interval is None else interval
        self._leading = leading

    @property
    def enabled(self) -> bool:
        return self.retention > 0

    async def trim_once(self) -> int:
        """Delete what is past the retention now, if leading; returns how many."""
        if not self._leading():
            return 0
        cutoff = datetime.fromtimestamp(time.time() - self.retention, tz=UTC)
        deleted = await self.history.trim_events(cutoff)
        if deleted:
            logger.info(
                "deleted %d WAL events older than %s",
                deleted,
                cutoff.isoformat(),
                extra={"deleted": deleted},
            )
        return deleted

    def next_round_in(self) -> float:
        return self.interval

    async def round(self) -> None:
        await self.trim_once()
