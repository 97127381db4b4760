"""The procedure manager: submit, run, retry, cancel, resume, and record procedures.

Only the leader runs procedures. On becoming leader the manager resumes every
unfinished record found in the kv backend; on losing leadership it stops its tasks
without writing anything (the next leader resumes them, and the election fence would
refuse our writes anyway). At most `procedure.max_running_procedures` run at once; the
rest wait as `pending`.

A step that raises a retryable `MetasrvError` is retried after an exponential backoff
with jitter (or the error's `next_retry_delay`), up to `procedure.max_retry_times`
retries; any other error fails the procedure. Terminal records stay in the kv backend
for `procedure.finished_ttl` (so the API finds recent ones quickly) and are written to
the SQL `procedure_history` table, which keeps them for good.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import random
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from sqlalchemy import Engine

from metasrv.background import ErrorSink, log_only
from metasrv.errors import (
    Cancelled,
    Conflict,
    InvalidArgument,
    LeadershipLost,
    MetasrvError,
    NotFound,
    NotLeader,
)
from metasrv.kafka import KafkaAdmin
from metasrv.kv import KvBackend
from metasrv.locks import TopicLocks
from metasrv.metrics import Metrics
from metasrv.settings import Settings
from procedures._batcher import KafkaBatcher
from procedures._group_commit import GroupCommitter
from procedures._history import History
from procedures._procedure import (
    Finish,
    Next,
    Procedure,
    ProcedureRecord,
    ProcedureState,
    ProcedureView,
    StepContext,
    StepRun,
)
from procedures._services import FlushMailbox, LeaderFence, Services, StatSource, TopicMap
from procedures._store import ProcedureStore, RecordConflict, Stored
from procedures.wal_purge import WalPurge

logger = logging.getLogger(__name__)

MAX_RETRY_DELAY = 30.0
"""Upper bound of one backoff sleep, seconds."""
CANCEL_WAIT = 5.0
"""How long `cancel()` waits for the procedure to stop before returning its view."""
_RESTARTS_AFTER_CONFLICT = 3
_SUBMIT_CONCURRENCY = 64
_POLL_INTERVAL = 0.2


def backoff_delay(attempt: int, base: float, *, rng: random.Random | None = None) -> float:
    """Delay before retry number `attempt` (1-based): base * 2^(attempt-1), +-50% jitter."""
    exp = base * (2 ** min(max(attempt - 1, 0), 30))
    jitter = 0.5 + (rng or random).random()
    return float(min(MAX_RETRY_DELAY, exp * jitter))


class ProcedureManager:
    """Runs procedures on the leader. Build one per process; wire `on_leadership`."""

    def __init__(
        self,
        kv: KvBackend,
        history: Engine | History,
        election: LeaderFence,
        kafka: KafkaAdmin,
        registry: StatSource,
        topology: TopicMap,
        mailbox: FlushMailbox,
        locks: TopicLocks,
        metrics: Metrics,
        settings: Settings,
        *,
        kv_threads: int = 16,
        batch_window: float = 0.005,
    ) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=kv_threads, thread_name_prefix="procedure-kv"
        )
        committer = GroupCommitter(kv, self._executor)
        self.services = Services(
            kv=kv,
            history=history if isinstance(history, History) else History(history),
            election=election,
            kafka=kafka,
            batcher=KafkaBatcher(kafka, window=batch_window),
            registry=registry,
            topology=topology,
            mailbox=mailbox,
            locks=locks,
            metrics=metrics,
            settings=settings,
            executor=self._executor,
            committer=committer,
        )
        self.store = ProcedureStore(
            kv, election.fence, executor=self._executor, committer=committer
        )
        self._kinds: dict[str, type[Procedure[Any]]] = {WalPurge.kind: WalPurge}
        self._settings = settings.procedure
        self._leading = False
        self._started = False
        self._stopped = False
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancel: dict[str, asyncio.Event] = {}
        self._done: dict[str, asyncio.Event] = {}
        self._latest: dict[str, ProcedureRecord] = {}
        self._slots = asyncio.Semaphore(self._settings.max_running_procedures)
        self._history_written: set[str] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.on_sweep_error: ErrorSink = log_only("procedure_sweeper")
        """Called with what a sweep of finished records raised (the runtime counts it)."""
        self._shutdown = asyncio.Event()
        self._leadership_lock = asyncio.Lock()

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the finished-record sweeper; resume procedures if already leader."""
        if self._started:
            return
        self._started = True
        add_listener = getattr(self.services.election, "add_listener", None)
        if add_listener is not None:
            add_listener(self.on_leadership)
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="procedure-sweeper")
        if self.services.election.is_leader:
            await self.on_leadership(True)

    @property
    def sweeper(self) -> asyncio.Task[None] | None:
        """The finished-record sweeper task, if started."""
        return self._sweeper

    async def stop(self) -> None:
        """Stop every task (no state written: a later leader resumes them). Repeat-safe."""
        if self._stopped:
            return
        self._stopped = True
        self._shutdown.set()
        await self._stop_tasks()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def __aenter__(self) -> ProcedureManager:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def on_leadership(self, is_leader: bool) -> None:
        """Election listener: resume everything unfinished when we lead, stop when we don't."""
        async with self._leadership_lock:
            if is_leader and not self._leading and not self._stopped:
                found = await self.store.scan()
                # Leading from here on, with every unfinished procedure already spawned,
                # so no caller sees us lead while a resumed procedure looks orphaned.
                self._leading = True
                self.services.metrics.is_leader.set(1)
                resumed = 0
                for stored in found:
                    record = stored.record
                    self._latest[record.id] = record
                    if not record.state.terminal:
                        self._spawn(record.id, stored)
                        resumed += 1
                if resumed:
                    logger.info("resumed unfinished procedures", extra={"count": resumed})
            elif not is_leader and self._leading:
                self._leading = False
                self.services.metrics.is_leader.set(0)
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

    def _require_leader(self) -> None:
        if not self._leading or not self.services.election.is_leader:
            raise NotLeader(self.services.election.leader_addr())

    # -- submission ---------------------------------------------------------------------

    async def submit_purge(self, topics: list[str] | None, *, reason: str) -> list[str]:
        """Submit a WAL purge per topic (every topic when None); return procedure ids.

        A topic that already has a purge in flight yields that procedure's id instead.
        Unknown topics raise `NotFound` before anything is submitted.
        """
        self._require_leader()
        topology = self.services.topology
        known = list(topology.topics())
        if topics is None:
            # Topics without regions have nothing to purge (they would only be skipped).
            wanted = [t for t in known if topology.regions_of(t)]
        else:
            known_set = set(known)
            wanted = list(dict.fromkeys(topics))
            missing = [t for t in wanted if t not in known_set]
            if missing:
                raise NotFound(
                    f"unknown topics: {', '.join(missing[:20])}", details={"topics": missing}
                )
        gate = asyncio.Semaphore(_SUBMIT_CONCURRENCY)

        async def one(topic: str) -> str:
            async with gate:
                return await self.submit(WalPurge.new(uuid.uuid4().hex, topic), reason=reason)

        return list(await asyncio.gather(*(one(t) for t in wanted)))

    async def submit(self, procedure: Procedure[Any], *, reason: str) -> str:
        """Persist and start a procedure; return its id (or the holder of its kv lock)."""
        self._require_leader()
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
            return created.procedure_id
        self._latest[record.id] = record
        self._spawn(record.id, Stored(record, created.revision))
        logger.info(
            "procedure submitted",
            extra={"procedure_id": record.id, "kind": record.kind, "topic": record.topic},
        )
        return record.id

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
        view = await self.services.history.get_procedure(procedure_id)
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
            for view in await self.services.history.list_procedures(
                state=state, topic=topic, limit=limit
            ):
                if view.id not in seen:
                    views.append(view)
        views.sort(key=lambda v: v.submitted_at, reverse=True)
        return views[:limit]

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
        persisted runs to the end regardless (see procedures/wal_purge.py).
        """
        view = await self.get(procedure_id)
        if view.state.terminal:
            raise Conflict(f"procedure {procedure_id} already {view.state.value}")
        self._require_leader()
        event = self._cancel.setdefault(procedure_id, asyncio.Event())
        event.set()
        logger.info("procedure cancel requested", extra={"procedure_id": procedure_id})
        return await self.wait(procedure_id, CANCEL_WAIT)

    # -- running ------------------------------------------------------------------------

    async def _run(self, procedure_id: str, stored: Stored | None) -> None:
        cancel = self._cancel[procedure_id]
        conflicts = 0
        failures = 0
        while True:
            try:
                # The record just created or scanned saves a read; restarts re-read it.
                known, stored = stored, None
                await self._run_once(procedure_id, cancel, known)
                return
            except RecordConflict as exc:
                # Usually an ambiguous commit (the write landed but its answer was lost):
                # reload and continue from what is stored; steps resume from checkpoints.
                conflicts += 1
                logger.warning(str(exc), extra={"procedure_id": procedure_id})
                if conflicts >= _RESTARTS_AFTER_CONFLICT:
                    logger.error(
                        "procedure abandoned after repeated write conflicts",
                        extra={"procedure_id": procedure_id},
                    )
                    return
            except LeadershipLost as exc:
                logger.warning(str(exc), extra={"procedure_id": procedure_id})
                return
            except MetasrvError as exc:
                # The kv backend failed while persisting: the stored record is still a
                # consistent checkpoint, so start over from it after a pause.
                failures += 1
                if not exc.retryable or failures > self._settings.max_retry_times:
                    logger.error(
                        "procedure run stopped: %s", exc, extra={"procedure_id": procedure_id}
                    )
                    return
                delay = backoff_delay(failures, self._settings.retry_delay)
                logger.warning(
                    "procedure state not persisted, restarting from the stored record in %.2fs: %s",
                    delay,
                    exc,
                    extra={"procedure_id": procedure_id},
                )
                await asyncio.sleep(delay)

    async def _run_once(
        self, procedure_id: str, cancel: asyncio.Event, stored: Stored | None
    ) -> None:
        if stored is None:
            stored = await self.store.load(procedure_id)
        if stored is None:
            logger.error("procedure record vanished", extra={"procedure_id": procedure_id})
            return
        if stored.record.state.terminal:
            self._latest[procedure_id] = stored.record
            self._done[procedure_id].set()
            return
        run = _Run(self, stored, cancel)
        await run.execute()

    async def _after_terminal(self, record: ProcedureRecord) -> None:
        """Metrics, history and waiters of a procedure that just ended."""
        metrics = self.services.metrics
        if record.finished_at is not None:
            metrics.procedure_duration.labels(kind=record.kind, state=record.state.value).observe(
                max(0.0, record.finished_at - record.submitted_at)
            )
        if record.kind == WalPurge.kind and record.state is ProcedureState.FAILED:
            metrics.purge_errors.labels(
                topic=record.topic or "", kind=record.error_code or "internal"
            ).inc()
        try:
            await self.services.history.record_procedure(record)
            self._history_written.add(record.id)
        except MetasrvError as exc:
            # The kv record stays until the sweeper has written it to history.
            logger.warning(
                "procedure history not written yet: %s",
                exc,
                extra={"procedure_id": record.id},
            )
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

    # -- expiry of finished kv records --------------------------------------------------

    def _sweep_interval(self) -> float:
        return max(0.5, min(60.0, self._settings.finished_ttl / 4))

    async def _sweep_loop(self) -> None:
        while not self._shutdown.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._shutdown.wait(), self._sweep_interval())
            if self._shutdown.is_set():
                return
            if not self._leading:
                continue
            try:
                await self.sweep()
            except Exception as exc:
                self.on_sweep_error(exc)

    async def sweep(self, now: float | None = None) -> int:
        """Write missing history rows; delete finished kv records older than the TTL."""
        now = time.time() if now is None else now
        ttl = self._settings.finished_ttl
        removed = 0
        for stored in await self.store.scan():
            record = stored.record
            if not record.state.terminal:
                continue
            if record.id not in self._history_written:
                if not await self.services.history.has_procedure(record.id):
                    await self.services.history.record_procedure(record)
                self._history_written.add(record.id)
            expired = record.finished_at is not None and record.finished_at + ttl <= now
            if expired and await self.store.delete(record.id, stored.revision):
                removed += 1
                self._latest.pop(record.id, None)
                self._done.pop(record.id, None)
                self._history_written.discard(record.id)
        return removed

    def running_count(self) -> int:
        """Procedures in a running or retrying state right now."""
        return sum(
            1
            for r in self._latest.values()
            if r.state in (ProcedureState.RUNNING, ProcedureState.RETRYING)
        )

    def kinds(self) -> Iterable[str]:
        """Registered procedure kinds."""
        return self._kinds.keys()

    def register_kind(self, kind: type[Procedure[Any]]) -> None:
        """Make another procedure kind submittable and resumable (before `start`)."""
        self._kinds[kind.kind] = kind


class _Run:
    """One execution of one procedure by this manager (until terminal or stopped)."""

    def __init__(self, manager: ProcedureManager, stored: Stored, cancel: asyncio.Event) -> None:
        self.m = manager
        self.record = stored.record
        self.revision = stored.revision
        self.cancel = cancel
        kind = manager._kinds.get(self.record.kind)
        if kind is None:
            raise InvalidArgument(f"unknown procedure kind {self.record.kind!r}")
        self.proc = kind(self.record.id, kind.decode(self.record.data))
        self.ctx = StepContext(
            procedure_id=self.record.id,
            submitted_at=self.record.submitted_at,
            services=manager.services,
            checkpoint=self.checkpoint,
            wait_cancel=self.wait_cancel,
            cancellable=self.proc.cancellable,
        )
        self.extra = {"procedure_id": self.record.id, "topic": self.record.topic}

    async def save(self, record: ProcedureRecord) -> None:
        self.revision = await self.m.store.save(record, self.revision)
        self.record = record
        self.m._latest[record.id] = record

    async def checkpoint(self) -> None:
        await self.save(replace(self.record, data=self.proc.encode()))

    async def wait_cancel(self, seconds: float) -> bool:
        if self.cancel.is_set():
            return True
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.cancel.wait(), seconds)
        return self.cancel.is_set()

    async def _acquire_slot(self) -> bool:
        """Wait for a running slot; False if the procedure was cancelled first."""
        slots = self.m._slots
        acquire = asyncio.ensure_future(slots.acquire())
        stop = asyncio.ensure_future(self.cancel.wait())
        try:
            await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not acquire.done():
                acquire.cancel()
                await asyncio.wait({acquire})
        except BaseException:
            acquire.cancel()
            # The acquire may have won the race against our own cancellation.
            acquire.add_done_callback(
                lambda f: slots.release() if not f.cancelled() and f.exception() is None else None
            )
            raise
        finally:
            stop.cancel()
        if acquire.cancelled():
            return False
        if self.cancel.is_set() and self.proc.cancellable():
            slots.release()
            return False
        return True

    async def execute(self) -> None:
        if not await self._acquire_slot():
            await self.finish_cancelled()
            return
        metrics = self.m.services.metrics
        metrics.procedures_running.inc()
        try:
            async with contextlib.AsyncExitStack() as held:
                await self._steps(held)
        finally:
            metrics.procedures_running.dec()
            self.m._slots.release()

    async def _steps(self, held: contextlib.AsyncExitStack) -> None:
        settings = self.m._settings
        now = time.time()
        await self.save(
            replace(
                self.record,
                state=ProcedureState.RUNNING,
                started_at=self.record.started_at or now,
            )
        )
        holding = False
        while True:
            step = self.record.step
            if self.cancel.is_set() and self.proc.cancellable():
                await self.finish_cancelled()
                return
            attempts = self.record.attempts + 1
            runs = list(self.record.steps)
            if not runs or runs[-1].step != step or runs[-1].finished_at is not None:
                runs.append(StepRun(step=step, started_at=time.time(), attempts=attempts))
            else:
                runs[-1] = replace(runs[-1], attempts=attempts)
            self.record = replace(self.record, attempts=attempts, steps=tuple(runs))
            logger.debug("step start", extra={**self.extra, "step": step, "attempt": attempts})
            try:
                if not holding:
                    await held.enter_async_context(self.proc.hold(self.ctx))
                    holding = True
                result = await self.proc.run_step(step, self.ctx)
            except Cancelled as exc:
                await self.finish_cancelled(str(exc))
                return
            except MetasrvError as exc:
                if isinstance(exc, LeadershipLost | RecordConflict):
                    raise
                if exc.retryable and attempts <= settings.max_retry_times:
                    await self._retry_later(step, attempts, exc)
                    continue
                await self.finish_failed(exc.code, exc.message)
                return
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:
                logger.exception("procedure step crashed", extra={**self.extra, "step": step})
                await self.finish_failed("internal", f"{type(exc).__name__}: {exc}")
                return
            runs = list(self.record.steps)
            runs[-1] = replace(runs[-1], finished_at=time.time())
            if isinstance(result, Next):
                await self.save(
                    replace(
                        self.record,
                        state=ProcedureState.RUNNING,
                        step=str(result.step.value),
                        attempts=0,
                        data=self.proc.encode(),
                        steps=tuple(runs),
                    )
                )
                continue
            assert isinstance(result, Finish)
            await self.finish(
                replace(
                    self.record,
                    state=result.state,
                    outcome=result.outcome,
                    data=self.proc.encode(),
                    steps=tuple(runs),
                )
            )
            return

    async def _retry_later(self, step: str, attempts: int, exc: MetasrvError) -> None:
        settings = self.m._settings
        delay = (
            exc.next_retry_delay
            if exc.next_retry_delay is not None
            else backoff_delay(attempts, settings.retry_delay)
        )
        logger.warning(
            "step failed, retrying in %.2fs: %s",
            delay,
            exc.message,
            extra={**self.extra, "step": step, "attempt": attempts},
        )
        if self.record.kind == WalPurge.kind:
            self.m.services.metrics.purge_errors.labels(
                topic=self.record.topic or "", kind=exc.code
            ).inc()
        runs = list(self.record.steps)
        runs[-1] = replace(runs[-1], error=exc.message)
        retrying = replace(
            self.record,
            state=ProcedureState.RETRYING,
            error=exc.message,
            error_code=exc.code,
            data=self.proc.encode(),
            steps=tuple(runs),
        )
        try:
            await self.save(retrying)
        except (LeadershipLost, RecordConflict):
            raise
        except MetasrvError as save_exc:
            # The kv backend may be what failed; keep the attempt count in memory.
            logger.warning("could not persist retry state: %s", save_exc, extra=self.extra)
            self.record = retrying
        if self.proc.cancellable():
            if await self.wait_cancel(delay):
                return  # the loop sees the cancel at its boundary
        else:
            await asyncio.sleep(delay)
        self.record = replace(self.record, state=ProcedureState.RUNNING)

    async def finish(self, record: ProcedureRecord) -> None:
        final = replace(record, finished_at=time.time())
        await self.save(final)
        await self.m._after_terminal(final)

    async def finish_failed(self, code: str, message: str) -> None:
        runs = list(self.record.steps)
        if runs:
            runs[-1] = replace(runs[-1], error=message)
        await self.finish(
            replace(
                self.record,
                state=ProcedureState.FAILED,
                error=message,
                error_code=code,
                data=self.proc.encode(),
                steps=tuple(runs),
            )
        )

    async def finish_cancelled(self, message: str | None = None) -> None:
        await self.finish(
            replace(
                self.record,
                state=ProcedureState.CANCELLED,
                error=message or "cancelled by operator",
                error_code=Cancelled.code,
                data=self.proc.encode(),
            )
        )
