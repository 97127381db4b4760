"""One execution of one procedure: its steps in order, retries, cancellation, the end.

The manager starts a `ProcedureRun` per procedure it runs or resumes and hands it every
collaborator it needs; the run reports each saved record and the terminal one back
through the two callbacks. `run_until_settled` starts a run again from the stored record
when a write conflicts or the kv backend fails. Nothing here knows a procedure kind:
kinds react to retries and to their end through `Procedure.on_retry` and
`Procedure.on_terminal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Generic, TypeVar

from metasrv.errors import Cancelled, LeadershipLost, MetasrvError
from metasrv.metrics import Metrics
from metasrv.process import Backoff, Jitter
from metasrv.settings import ProcedureSettings
from metasrv.wire import ProcedureState
from procedures._procedure import (
    Finish,
    Next,
    Procedure,
    ProcedureRecord,
    StepContext,
    StepRun,
)
from procedures._store import ProcedureStore, RecordConflict, Stored

logger = logging.getLogger(__name__)

S = TypeVar("S")
"""The services steps use."""

MAX_RETRY_DELAY = 30.0
"""Upper bound of one retry's wait, seconds (`step_backoff`)."""
RESTARTS_AFTER_CONFLICT = 3
"""Reloads of a procedure's record after write conflicts before it is left to a restart."""


def step_backoff(settings: ProcedureSettings) -> Backoff | None:
    """How long a step (or a run that could not persist) waits before retry k: from
    `procedure.retry_delay`, doubling, +-50% jitter, at most `MAX_RETRY_DELAY` (a
    `retry_delay` above it is its own cap). None for a `retry_delay` of 0: retry at once."""
    base = float(settings.retry_delay)
    if base <= 0:
        return None
    return Backoff(base=base, cap=max(base, MAX_RETRY_DELAY), jitter=Jitter.SPREAD)


def retry_delay(settings: ProcedureSettings, attempt: int) -> float:
    """The wait before retry number `attempt` (1-based) by `step_backoff`."""
    backoff = step_backoff(settings)
    return 0.0 if backoff is None else backoff.delay(attempt - 1)


def retry_budget(settings: ProcedureSettings) -> float:
    """The longest the backoff sleeps of one step's retries add up to: every one of
    `max_retry_times` retries at its longest."""
    backoff = step_backoff(settings)
    if backoff is None:
        return 0.0
    return sum(backoff.longest(k) for k in range(settings.max_retry_times))


class ProcedureRun(Generic[S]):
    """Runs `procedure` from its stored record until it is terminal or stopped."""

    def __init__(
        self,
        procedure: Procedure[Any, S],
        stored: Stored,
        *,
        cancel: asyncio.Event,
        slots: asyncio.Semaphore,
        store: ProcedureStore,
        services: S,
        metrics: Metrics,
        settings: ProcedureSettings,
        on_saved: Callable[[ProcedureRecord], None],
        on_terminal: Callable[[ProcedureRecord], Awaitable[None]],
    ) -> None:
        self.proc = procedure
        self.record = stored.record
        self.revision = stored.revision
        self.cancel = cancel
        self._slots = slots
        self._store = store
        self._metrics = metrics
        self._settings = settings
        self._on_saved = on_saved
        self._on_terminal = on_terminal
        self.ctx: StepContext[S] = StepContext(
            procedure_id=self.record.id,
            submitted_at=self.record.submitted_at,
            services=services,
            save=self.save_data,
            wait_cancel=self.wait_cancel,
            cancellable=procedure.cancellable,
        )
        self.extra = {"procedure_id": self.record.id, "topic": self.record.topic}

    async def save(self, record: ProcedureRecord) -> None:
        self.revision = await self._store.save(record, self.revision)
        self.record = record
        self._on_saved(record)

    async def save_data(self) -> None:
        """Persist the procedure's current data in its record (`StepContext.save`)."""
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
        slots = self._slots
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
        self._metrics.procedures_running.inc()
        try:
            async with contextlib.AsyncExitStack() as held:
                await self._steps(held)
        finally:
            self._metrics.procedures_running.dec()
            self._slots.release()

    async def _steps(self, held: contextlib.AsyncExitStack) -> None:
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
                if exc.retryable and attempts <= self._settings.max_retry_times:
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
        delay = (
            exc.next_retry_delay
            if exc.next_retry_delay is not None
            else retry_delay(self._settings, attempts)
        )
        logger.warning(
            "step failed, retrying in %.2fs: %s",
            delay,
            exc.message,
            extra={**self.extra, "step": step, "attempt": attempts},
        )
        self.proc.on_retry(self.ctx, exc)
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
        await self._on_terminal(final)

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


async def run_until_settled(
    run: Callable[[Stored | None], Awaitable[None]],
    procedure_id: str,
    stored: Stored | None,
    settings: ProcedureSettings,
) -> None:
    """Call `run` (one `ProcedureRun` from the stored record, or from `stored` the first
    time) until it returns. After a write conflict it reloads and continues, at most
    `RESTARTS_AFTER_CONFLICT` times; after a retryable kv failure it starts over from the
    stored record after a backoff, at most `max_retry_times` times; leadership lost ends
    it (the next leader resumes the procedure). A run given up leaves its record
    unfinished: the manager adopts it again (`ProcedureManager.adopt`) at its next sweep,
    or when a submit finds the record's lock held."""
    conflicts = 0
    failures = 0
    while True:
        try:
            # The record just created or scanned saves a read; restarts re-read it.
            known, stored = stored, None
            await run(known)
            return
        except RecordConflict as exc:
            # Usually an ambiguous commit (the write landed but its answer was lost):
            # reload and continue from what is stored; steps resume from saved state.
            conflicts += 1
            logger.warning(str(exc), extra={"procedure_id": procedure_id})
            if conflicts >= RESTARTS_AFTER_CONFLICT:
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
            # consistent saved state, so start over from it after a pause.
            failures += 1
            if not exc.retryable or failures > settings.max_retry_times:
                logger.error("procedure run stopped: %s", exc, extra={"procedure_id": procedure_id})
                return
            delay = retry_delay(settings, failures)
            logger.warning(
                "procedure state not persisted, restarting from the stored record in %.2fs: %s",
                delay,
                exc,
                extra={"procedure_id": procedure_id},
            )
            await asyncio.sleep(delay)
