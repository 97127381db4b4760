"""The procedure manager: submit, resume, cancel, list and expire procedures.

It knows no procedure kind: the runtime passes the kinds it runs and the `services`
their steps use. One procedure's execution (steps, retries, the end) is a
`ProcedureRun`, restarted after write conflicts and kv failures by `run_until_settled`
(both in `_runner.py`); finished records are written to the history and expired by
`FinishedRecords` (`_finished.py`).

Only the leader runs procedures. On becoming leader the manager resumes every unfinished
record found in the kv backend, and while leading it adopts (resumes the same way) any
unfinished record no task of its runs: a run given up after repeated kv failures or
write conflicts, a create whose outcome could not be read back. It looks for them at
every sweep of finished records and whenever a submit finds its lock held by one, so
such a record runs again within one sweep interval, not at the next leader change. On
losing leadership it stops its tasks without writing anything (the next leader resumes
them, and the election fence would refuse our writes anyway). At most
`procedure.max_running_procedures` run at once; the rest wait as `pending`.

A step that raises a retryable `MetasrvError` is retried after an exponential backoff
with jitter (or the error's `next_retry_delay`), up to `procedure.max_retry_times`
retries; any other error fails the procedure. Terminal records stay in the kv backend
for `procedure.finished_ttl` (so the API finds recent ones quickly) and are written to
the SQL `procedure_history` table, which keeps them for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from metasrv.errors import Conflict, InvalidArgument, MetasrvError, NotFound, NotLeader
from metasrv.metrics import Metrics
from metasrv.process import ErrorSink
from metasrv.settings import ProcedureSettings
from metasrv.wire import ProcedureState
from procedures._finished import FinishedRecords
from procedures._history import History
from procedures._leader import LeaderFence
from procedures._procedure import Procedure, ProcedureRecord, ProcedureView
from procedures._runner import ProcedureRun, retry_budget, run_until_settled
from procedures._store import ProcedureStore, Stored

logger = logging.getLogger(__name__)

CANCEL_WAIT = 5.0
"""How long `cancel()` waits for the procedure to stop before returning its view."""
_POLL_INTERVAL = 0.2

S = TypeVar("S")
"""The services the kinds' steps use."""


class ProcedureManager(Generic[S]):
    """Runs procedures on the leader. Build one per process; its leadership calls `lead`
    and `follow`."""

    def __init__(
        self,
        store: ProcedureStore,
        history: History,
        election: LeaderFence,
        metrics: Metrics,
        settings: ProcedureSettings,
        *,
        services: S,
        kinds: Iterable[type[Procedure[Any, S]]],
    ) -> None:
        self.store = store
        self.history = history
        self.election = election
        self.metrics = metrics
        self.services = services
        """What steps use (`StepContext.services`); the kinds define its shape."""
        self._kinds: dict[str, type[Procedure[Any, S]]] = {kind.kind: kind for kind in kinds}
        self._settings = settings
        self._leading = False
        self._started = False
        self._stopped = False
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancel: dict[str, asyncio.Event] = {}
        self._done: dict[str, asyncio.Event] = {}
        self._latest: dict[str, ProcedureRecord] = {}
        self._slots = asyncio.Semaphore(self._settings.max_running_procedures)
        self._finished = FinishedRecords(
            store,
            history,
            settings,
            leading=lambda: self._leading,
            forget=self._forget,
            adopt=self._adopt,
        )
        self._leadership_lock = asyncio.Lock()

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the finished-record sweeper. Procedures run between `lead` and `follow`,
        which the process's leadership calls (metasrv.leader.Leadership)."""
        if self._started:
            return
        self._started = True
        await self._finished.start()

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The finished-record sweeper task, if started (`FinishedRecords`): the loop a
        supervisor watches."""
        return self._finished.task

    @property
    def on_sweep_error(self) -> ErrorSink:
        """Called with what a sweep of finished records raised (the runtime counts it)."""
        return self._finished.on_error

    @on_sweep_error.setter
    def on_sweep_error(self, sink: ErrorSink) -> None:
        self._finished.on_error = sink

    async def stop(self) -> None:
        """Stop every task (no state written: a later leader resumes them). Repeat-safe."""
        if self._stopped:
            return
        self._stopped = True
        await self._stop_tasks()
        await self._finished.stop()

    async def __aenter__(self) -> ProcedureManager[S]:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def lead(self) -> bool:
        """Leader start hook: resume everything unfinished. False if leadership went first."""
        async with self._leadership_lock:
            if self._leading or self._stopped:
                return not self._stopped
            found = await self.store.scan()
            if not self.election.is_leader:
                return False
            # Leading from here on, with every unfinished procedure already spawned,
            # so no caller sees us lead while a resumed procedure looks orphaned.
            self._leading = True
            resumed = 0
            for stored in found:
                record = stored.record
                self._latest[record.id] = record
                if not record.state.terminal:
                    self._spawn(record.id, stored)
                    resumed += 1
            if resumed:
                logger.info("resumed unfinished procedures", extra={"count": resumed})
            return True

    async def follow(self) -> None:
        """Leader stop hook: stop every running procedure (a later leader resumes it)."""
        async with self._leadership_lock:
            if self._leading:
                self._leading = False
                await self._stop_tasks()

    async def _stop_tasks(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    @property
    def leading(self) -> bool:
        """True while this manager runs procedures."""
        return self._leading

    def require_leader(self) -> None:
        """Raise `NotLeader` unless this manager runs procedures now."""
        if not self._leading or not self.election.is_leader:
            raise NotLeader(self.election.leader_addr())

    # -- submission ---------------------------------------------------------------------

    async def submit(self, procedure: Procedure[Any, S], *, reason: str) -> str:
        """Persist and start a procedure; return its id (or the holder of its kv lock)."""
        self.require_leader()
        if procedure.kind not in self._kinds:
            raise InvalidArgument(f"unknown procedure kind {procedure.kind!r}")
        record = ProcedureRecord(
            id=procedure.id,
            kind=procedure.kind,
            topic=procedure.topic,
            state=ProcedureState.PENDING,
            step=str(procedure.first_step.value),
            attempts=0,
            reason=reason,
            data=procedure.encode(),
            submitted_at=time.time(),
            kv_locks=procedure.kv_locks(),
        )
        created = await self.store.create(record)
        if not created.created:
            await self._adopt_holder(created.procedure_id)
            return created.procedure_id
        if record.id not in self._tasks:  # else a sweep adopted it already
            self._latest[record.id] = record
            self._spawn(record.id, Stored(record, created.revision))
        logger.info(
            "procedure submitted",
            extra={"procedure_id": record.id, "kind": record.kind, "topic": record.topic},
        )
        return record.id

    # -- adoption -----------------------------------------------------------------------

    async def adopt(self) -> int:
        """Run every unfinished record no task of this manager runs, as a new leader
        resumes them; return how many. The sweep does this periodically and a submit
        for the holder of its lock; this is the same on demand."""
        if not self._leading:
            return 0
        return sum(self._adopt(stored) for stored in await self.store.scan())

    def _adopt(self, stored: Stored) -> bool:
        """Run `stored` if it is unfinished and nothing here runs it.

        Such a record (its lock held, nothing running it) is left by a run that
        `run_until_settled` gave up (repeated kv failures or write conflicts) or by a
        create whose outcome could not be read back; without this it would wait for
        the next leader, and its topic's purges with it. A stale read is harmless: a
        run from an outdated record loses its first CAS and reloads."""
        record = stored.record
        if (
            not self._leading
            or record.state.terminal
            or record.id in self._tasks
            or record.kind not in self._kinds
        ):
            return False
        known = self._latest.get(record.id)
        if known is not None and known.state.terminal:
            return False  # it ended after the read
        logger.warning(
            "adopting an unfinished procedure no task runs",
            extra={"procedure_id": record.id, "topic": record.topic, "state": record.state.value},
        )
        self._latest[record.id] = record
        self._spawn(record.id, stored)
        return True

    async def _adopt_holder(self, procedure_id: str) -> None:
        """A submit found its lock held by `procedure_id`: run it if nothing here does."""
        if procedure_id in self._tasks or not self._leading:
            return
        try:
            stored = await self.store.load(procedure_id)
        except MetasrvError as exc:
            # The answer (the holder's id) stands; the next sweep adopts it.
            logger.warning(
                "could not read the holder of a procedure lock: %s",
                exc,
                extra={"procedure_id": procedure_id},
            )
            return
        if stored is not None:
            self._adopt(stored)

    def _spawn(self, procedure_id: str, stored: Stored | None = None) -> None:
        if procedure_id in self._tasks or not self._leading:
            return
        self._cancel.setdefault(procedure_id, asyncio.Event())
        self._done.setdefault(procedure_id, asyncio.Event())
        task = asyncio.create_task(
            self._run(procedure_id, stored), name=f"procedure-{procedure_id}"
        )
        self._tasks[procedure_id] = task
        task.add_done_callback(functools.partial(self._forget_task, procedure_id))

    def _forget_task(self, procedure_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(procedure_id) is task:
            del self._tasks[procedure_id]
        done = self._done.get(procedure_id)
        if done is not None and not done.is_set():
            # Stopped before a terminal state (leadership lost, abandoned): another leader
            # will finish it, so wake our waiters (e.g. a ticker round) now rather than
            # never; a later resume here gets a fresh event.
            del self._done[procedure_id]
            done.set()
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "procedure task crashed",
                exc_info=task.exception(),
                extra={"procedure_id": procedure_id},
            )

    # -- reads --------------------------------------------------------------------------

    async def get(self, procedure_id: str) -> ProcedureView:
        """The procedure's current view; `NotFound` if neither kv nor history knows it."""
        record = self._latest.get(procedure_id)
        if record is None or not self._leading:
            stored = await self.store.load(procedure_id)
            record = stored.record if stored is not None else None
        if record is not None:
            return ProcedureView.of(record)
        view = await self.history.get_procedure(procedure_id)
        if view is None:
            raise NotFound(f"procedure {procedure_id} not found")
        return view

    async def list(
        self,
        state: ProcedureState | str | None = None,
        *,
        topic: str | None = None,
        limit: int = 100,
    ) -> list[ProcedureView]:
        """Procedures from the kv backend (unfinished, recent) and SQL history, newest first."""
        if isinstance(state, str):
            try:
                state = ProcedureState(state)
            except ValueError as exc:
                raise InvalidArgument(f"unknown procedure state {state!r}") from exc
        if limit < 1:
            raise InvalidArgument("limit must be >= 1")
        records = [s.record for s in await self.store.scan()]
        seen = {r.id for r in records}
        views = [
            ProcedureView.of(r)
            for r in records
            if (state is None or r.state is state) and (topic is None or r.topic == topic)
        ]
        if state is None or state.terminal:
            for view in await self.history.list_procedures(state=state, topic=topic, limit=limit):
                if view.id not in seen:
                    views.append(view)
        views.sort(key=lambda v: v.submitted_at, reverse=True)
        return views[:limit]

    @property
    def retry_budget(self) -> float:
        """Seconds the retries of one step can sleep in all (`procedure.max_retry_times`
        backoffs of `procedure.retry_delay`, each at its longest): what a caller waiting
        on a procedure allows for its retries."""
        return retry_budget(self._settings)

    def in_flight(self, topic: str) -> str | None:
        """Id of the unfinished procedure on `topic` known to this manager, if any."""
        for record in self._latest.values():
            if record.topic == topic and not record.state.terminal:
                return record.id
        return None

    async def wait(self, procedure_id: str, timeout: float | None = None) -> ProcedureView:
        """Wait until the procedure is terminal (or `timeout`); return its view.

        Procedures this manager runs are awaited directly; others (run by another
        leader, or not resumed yet) are polled.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        done = self._done.get(procedure_id)
        if done is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout)
            return await self.get(procedure_id)
        while True:
            view = await self.get(procedure_id)
            if view.state.terminal or (deadline is not None and time.monotonic() >= deadline):
                return view
            done = self._done.get(procedure_id)
            if done is not None:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), remaining)
                return await self.get(procedure_id)
            await asyncio.sleep(_POLL_INTERVAL)

    # -- cancel -------------------------------------------------------------------------

    async def cancel(self, procedure_id: str) -> ProcedureView:
        """Ask a procedure to stop; `Conflict` if already terminal, `NotFound` if unknown.

        It stops at its next step boundary or wait. A purge whose deletion intent is
        persisted runs to the end regardless (`Procedure.cancellable`).
        """
        view = await self.get(procedure_id)
        if view.state.terminal:
            raise Conflict(f"procedure {procedure_id} already {view.state.value}")
        self.require_leader()
        event = self._cancel.setdefault(procedure_id, asyncio.Event())
        event.set()
        logger.info("procedure cancel requested", extra={"procedure_id": procedure_id})
        return await self.wait(procedure_id, CANCEL_WAIT)

    # -- running ------------------------------------------------------------------------

    async def _run(self, procedure_id: str, stored: Stored | None) -> None:
        run = functools.partial(self._run_once, procedure_id, self._cancel[procedure_id])
        await run_until_settled(run, procedure_id, stored, self._settings)

    async def _run_once(
        self, procedure_id: str, cancel: asyncio.Event, stored: Stored | None
    ) -> None:
        if stored is None:
            stored = await self.store.load(procedure_id)
        if stored is None:
            logger.error("procedure record vanished", extra={"procedure_id": procedure_id})
            return
        if stored.record.state.terminal:
            known = self._latest.get(procedure_id)
            self._latest[procedure_id] = stored.record
            if known is not None and not known.state.terminal:
                # Our own terminal write landed though its answer was lost (a restart
                # found it): end as that write's answer would have (hooks, history).
                await self._after_terminal(stored.record)
            else:
                self._done[procedure_id].set()
            return
        kind = self._kinds.get(stored.record.kind)
        if kind is None:
            raise InvalidArgument(f"unknown procedure kind {stored.record.kind!r}")
        run = ProcedureRun(
            kind(procedure_id, kind.decode(stored.record.data)),
            stored,
            cancel=cancel,
            slots=self._slots,
            store=self.store,
            services=self.services,
            metrics=self.metrics,
            settings=self._settings,
            on_saved=self._saved,
            on_terminal=self._after_terminal,
        )
        await run.execute()

    def _saved(self, record: ProcedureRecord) -> None:
        self._latest[record.id] = record

    async def _after_terminal(self, record: ProcedureRecord) -> None:
        """Metrics, history and waiters of a procedure that just ended."""
        metrics = self.metrics
        if record.finished_at is not None:
            metrics.procedure_duration.labels(kind=record.kind, state=record.state.value).observe(
                max(0.0, record.finished_at - record.submitted_at)
            )
        kind = self._kinds.get(record.kind)
        if kind is not None:
            kind.on_terminal(record, self.services)
        await self._finished.record(record)
        self._done.setdefault(record.id, asyncio.Event()).set()
        self._cancel.pop(record.id, None)
        logger.info(
            "procedure finished",
            extra={
                "procedure_id": record.id,
                "topic": record.topic,
                "state": record.state.value,
                "outcome": record.outcome,
                "error": record.error,
            },
        )

    # -- finished kv records -------------------------------------------------------------

    async def sweep(self, now: float | None = None) -> int:
        """Write missing history rows; delete finished kv records older than the TTL
        (`FinishedRecords.sweep`)."""
        return await self._finished.sweep(now)

    def _forget(self, procedure_id: str) -> None:
        """A finished record left the kv backend: it is read from the history now."""
        self._latest.pop(procedure_id, None)
        self._done.pop(procedure_id, None)
