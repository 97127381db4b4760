"""The procedure model: persisted records, step results, and the `Procedure` base class.

A procedure is a small state machine. Its steps are the members of an `Enum` (the
subclass's `Step`), each handled by a method named `step_<value>`; the base class checks
at class-creation time that the table is complete (Temporal's `_apply_<job>` dispatch).
After every step, and whenever a step calls `ctx.save()`, the manager persists the
whole record with a compare-and-swap on its kv revision, so a runner that dies resumes
exactly at the last persisted point. Steps must therefore be idempotent from any saved
state: they read what the typed data says was already done and continue from there.
("Checkpoint" is reserved for a region's persisted prunable entry id, `metasrv.leader`.)

The framework is generic over what steps use, their services: a `Procedure[D, S]` keeps
data `D` and runs with a `StepContext[S]`, and a `ProcedureManager[S]` runs kinds whose
steps need no more than `S` (a kind that needs less, `object`, runs anywhere).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import orjson

from metasrv.errors import Cancelled, MetasrvError
from metasrv.wire import ProcedureState

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepRun:
    """One step's execution as recorded in the procedure's step log."""

    step: str
    """Step name (the Enum value)."""
    started_at: float
    """Wall-clock time (epoch seconds) the first attempt of the step began."""
    finished_at: float | None = None
    """Wall-clock time the step completed; None while it is running or if it never did."""
    attempts: int = 1
    """Executions of the step so far (1 + retries)."""
    error: str | None = None
    """Last error the step raised, if any."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> StepRun:
        return cls(
            step=str(raw["step"]),
            started_at=float(raw["started_at"]),
            finished_at=None if raw.get("finished_at") is None else float(raw["finished_at"]),
            attempts=int(raw.get("attempts", 1)),
            error=raw.get("error"),
        )


@dataclass(frozen=True, slots=True)
class ProcedureRecord:
    """Everything persisted about one procedure (kv `__procedure__/{id}/state`)."""

    id: str
    """Procedure id (a UUID4 hex string)."""
    kind: str
    """Procedure kind, e.g. `wal_purge`; picks the class that runs it."""
    topic: str | None
    """Topic the procedure works on, when it has one."""
    state: ProcedureState
    """Current lifecycle state."""
    step: str
    """Step to run next (or the step it ended in, once terminal)."""
    attempts: int
    """Executions of the current step so far (0 before it first ran)."""
    reason: str
    """Why it was submitted (`manual`, `ticker`, `size_trigger`, ...)."""
    data: dict[str, Any]
    """The procedure's own typed data, encoded as JSON-ready values."""
    submitted_at: float
    """Wall-clock time of submission (epoch seconds)."""
    started_at: float | None = None
    """Wall-clock time it first started running."""
    finished_at: float | None = None
    """Wall-clock time it reached a terminal state."""
    error: str | None = None
    """Last error message (kept after a successful retry until the next step)."""
    error_code: str | None = None
    """Stable code of the last error (`MetasrvError.code`)."""
    outcome: str | None = None
    """Terminal summary: why it was skipped, what it purged."""
    steps: tuple[StepRun, ...] = ()
    """Step log, in execution order."""
    kv_locks: tuple[str, ...] = field(default=())
    """Kv keys created with the record and deleted with its terminal write."""

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "id": self.id,
                "kind": self.kind,
                "topic": self.topic,
                "state": self.state.value,
                "step": self.step,
                "attempts": self.attempts,
                "reason": self.reason,
                "data": self.data,
                "submitted_at": self.submitted_at,
                "started_at": self.started_at,
                "finished_at": self.finished_at,
                "error": self.error,
                "error_code": self.error_code,
                "outcome": self.outcome,
                "steps": [s.to_json() for s in self.steps],
                "kv_locks": list(self.kv_locks),
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> ProcedureRecord:
        obj = orjson.loads(raw)
        return cls(
            id=obj["id"],
            kind=obj["kind"],
            topic=obj.get("topic"),
            state=ProcedureState(obj["state"]),
            step=obj["step"],
            attempts=int(obj.get("attempts", 0)),
            reason=obj.get("reason", ""),
            data=dict(obj.get("data") or {}),
            submitted_at=float(obj["submitted_at"]),
            started_at=obj.get("started_at"),
            finished_at=obj.get("finished_at"),
            error=obj.get("error"),
            error_code=obj.get("error_code"),
            outcome=obj.get("outcome"),
            steps=tuple(StepRun.from_json(s) for s in obj.get("steps") or ()),
            kv_locks=tuple(obj.get("kv_locks") or ()),
        )

    def timings(self) -> dict[str, float]:
        """Seconds spent per finished step (a step run twice after a resume is summed)."""
        out: dict[str, float] = {}
        for run in self.steps:
            if run.finished_at is not None:
                out[run.step] = out.get(run.step, 0.0) + max(0.0, run.finished_at - run.started_at)
        return out


@dataclass(frozen=True, slots=True)
class ProcedureView:
    """What the API shows about a procedure (from the kv record or SQL history)."""

    id: str
    kind: str
    """Procedure kind, e.g. `wal_purge`."""
    topic: str | None
    state: ProcedureState
    """pending, running, retrying, succeeded, skipped, failed or cancelled."""
    step: str | None
    """Current step, or the step it ended in."""
    attempts: int
    """Executions of the current (or last) step."""
    error: str | None
    error_code: str | None
    """Stable code of the last error."""
    reason: str
    """Why it was submitted."""
    outcome: str | None
    """Terminal summary (skip reason, purge result)."""
    submitted_at: float
    """Submission time, epoch seconds."""
    started_at: float | None
    """First start, epoch seconds."""
    finished_at: float | None
    """Terminal time, epoch seconds."""
    timings: Mapping[str, float]
    """Seconds per finished step."""
    steps: tuple[StepRun, ...]
    """Step log: each step's start, end, attempts and last error."""
    data: Mapping[str, Any]
    """The procedure's own data (prune point, flush candidates, ...)."""

    @classmethod
    def of(cls, record: ProcedureRecord) -> ProcedureView:
        return cls(
            id=record.id,
            kind=record.kind,
            topic=record.topic,
            state=record.state,
            step=record.step,
            attempts=record.attempts,
            error=record.error,
            error_code=record.error_code,
            reason=record.reason,
            outcome=record.outcome,
            submitted_at=record.submitted_at,
            started_at=record.started_at,
            finished_at=record.finished_at,
            timings=record.timings(),
            steps=record.steps,
            data=dict(record.data),
        )


# --- step results ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Next:
    """Continue with `step`."""

    step: enum.Enum


@dataclass(frozen=True, slots=True)
class Finish:
    """End the procedure in `state` (succeeded or skipped) with a one-line `outcome`."""

    state: ProcedureState
    """SUCCEEDED or SKIPPED."""
    outcome: str
    """Human-readable summary, stored and shown by the API."""

    def __post_init__(self) -> None:
        if self.state not in (ProcedureState.SUCCEEDED, ProcedureState.SKIPPED):
            raise ValueError("a step finishes only as succeeded or skipped; raise for failures")


StepResult = Next | Finish


# --- the context a step runs in ---------------------------------------------------------


ServicesT_co = TypeVar("ServicesT_co", covariant=True)
"""What steps use, as a context hands it out (read-only)."""


class StepContext(Generic[ServicesT_co]):
    """Handed to every step: persistence, cancellation and logging for one procedure run.

    The manager builds one per run; `services` carries what the procedure uses.
    """

    def __init__(
        self,
        *,
        procedure_id: str,
        submitted_at: float,
        services: ServicesT_co,
        save: Callable[[], Awaitable[None]],
        wait_cancel: Callable[[float], Awaitable[bool]],
        cancellable: Callable[[], bool],
    ) -> None:
        self.procedure_id = procedure_id
        self.submitted_at = submitted_at
        self._services = services
        self._save = save
        self._wait_cancel = wait_cancel
        self._cancellable = cancellable

    @property
    def services(self) -> ServicesT_co:
        """What the procedure's steps use (the manager's `services`)."""
        return self._services

    async def save(self) -> None:
        """Persist the procedure's current data now, without moving to another step."""
        await self._save()

    async def sleep(self, seconds: float) -> None:
        """Sleep; raise `Cancelled` at once if an operator cancels meanwhile (when allowed)."""
        if not self._cancellable():
            await asyncio.sleep(seconds)
            return
        if await self._wait_cancel(seconds):
            raise Cancelled(f"procedure {self.procedure_id} cancelled")


# --- the base class ---------------------------------------------------------------------

DataT = TypeVar("DataT")
ServicesT_contra = TypeVar("ServicesT_contra", contravariant=True)
"""What a procedure kind's steps need: it runs with these services or any richer ones."""


class Procedure(ABC, Generic[DataT, ServicesT_contra]):
    """Base of every procedure kind: data `DataT`, run with services `ServicesT_contra`.

    Subclasses set `kind`, `Step` (an Enum whose values are step names) and `first_step`,
    define `step_<value>(ctx) -> StepResult` for each member, and encode/decode their data.
    """

    kind: ClassVar[str]
    Step: ClassVar[type[enum.Enum]]
    first_step: ClassVar[enum.Enum]
    _dispatch: ClassVar[dict[str, str]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if getattr(cls, "__abstractmethods__", None):
            return
        table: dict[str, str] = {}
        for member in cls.Step:
            name = f"step_{member.value}"
            if not callable(getattr(cls, name, None)):
                raise TypeError(f"{cls.__name__} lacks {name}() for step {member!r}")
            table[str(member.value)] = name
        cls._dispatch = table

    def __init__(self, procedure_id: str, data: DataT) -> None:
        self.id = procedure_id
        self.data = data

    # -- data codec ---------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def decode(cls, raw: Mapping[str, Any]) -> DataT:
        """Typed data from its persisted JSON form."""

    @abstractmethod
    def encode(self) -> dict[str, Any]:
        """JSON-ready form of `self.data`."""

    # -- identity -----------------------------------------------------------------------

    @property
    def topic(self) -> str | None:
        """Topic the procedure works on, if any (listed and used for de-duplication)."""
        return None

    def kv_locks(self) -> tuple[str, ...]:
        """Kv keys that must be absent to submit this procedure; held until it ends."""
        return ()

    def cancellable(self) -> bool:
        """Whether an operator's cancel may stop it now (False once it must run to the end)."""
        return True

    @asynccontextmanager
    async def hold(self, ctx: StepContext[ServicesT_contra]) -> AsyncIterator[None]:
        """In-memory resources held while the procedure runs (default: none)."""
        yield

    # -- hooks (the manager calls these; the defaults do nothing) -----------------------

    def on_retry(self, ctx: StepContext[ServicesT_contra], error: MetasrvError) -> None:
        """A step failed with a retryable error and will run again after a backoff."""

    @classmethod
    def on_terminal(cls, record: ProcedureRecord, services: ServicesT_contra) -> None:
        """A procedure of this kind ended (any terminal state), before its waiters wake."""

    # -- dispatch -----------------------------------------------------------------------

    async def run_step(self, step: str, ctx: StepContext[ServicesT_contra]) -> StepResult:
        """Run the handler of `step`."""
        name = self._dispatch.get(step)
        if name is None:
            raise ValueError(f"{self.kind} has no step {step!r}")
        handler: Callable[[StepContext[ServicesT_contra]], Awaitable[StepResult]]
        handler = getattr(self, name)
        return await handler(ctx)
