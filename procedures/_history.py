"""The SQL history: finished procedures, completed purges and WAL events.

The kv backend holds procedures only while they run (and for `procedure.finished_ttl`
after); SQL keeps them for good, with every completed purge, for the API, the dashboard
and the Spark reconcile job. WAL events (data loss, every prune attempt's moments) are
kept for `history.events_retention` (`trim_events`). Tables are defined in
`metasrv/sql/_schema.py` and created by the Alembic migrations.

The engine is blocking; every method here runs it in a worker thread. Writes are
idempotent per procedure id, because a resumed procedure may write its history twice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Collection
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import sqlalchemy.exc as sa_exc
from sqlalchemy import Engine, delete, func, insert, select, update

from metasrv.errors import Unavailable
from metasrv.sql import procedure_history_table, purge_history_table, wal_events_table
from metasrv.wire import ProcedureState, PurgeRecord, WalEvent
from procedures._procedure import ProcedureRecord, ProcedureView, StepRun

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

MAX_LIMIT = 10_000
"""Most rows one history read returns."""


def to_datetime(epoch: float) -> datetime:
    """Epoch seconds -> aware UTC datetime."""
    return datetime.fromtimestamp(epoch, tz=UTC)


def _aware(value: datetime) -> datetime:
    """UTC when naive (SQLite keeps no zone)."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _utc(value: datetime) -> datetime:
    """In UTC (naive: taken as UTC). SQLite compares stored times as text, without their
    zone, so every time written or compared is UTC."""
    return _aware(value).astimezone(UTC)


def to_epoch(value: datetime | None) -> float | None:
    """Aware or naive-UTC (SQLite) datetime -> epoch seconds."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _steps_json(record: ProcedureRecord) -> dict[str, Any]:
    # Step runs plus the few record fields procedure_history has no column for.
    return {
        "runs": [s.to_json() for s in record.steps],
        "reason": record.reason,
        "outcome": record.outcome,
        "error_code": record.error_code,
        "started_at": record.started_at,
        "data": record.data,
    }


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _view_of_row(row: Any) -> ProcedureView:
    steps: dict[str, Any] = row.steps if isinstance(row.steps, dict) else {"runs": row.steps or []}
    runs = tuple(StepRun.from_json(s) for s in steps.get("runs") or ())
    record = ProcedureRecord(
        id=row.procedure_id,
        kind=row.kind,
        topic=row.topic,
        state=ProcedureState(row.state),
        step=row.step or "",
        attempts=row.attempts,
        reason=str(steps.get("reason") or ""),
        data=dict(steps.get("data") or {}),
        submitted_at=to_epoch(row.submitted_at) or 0.0,
        started_at=None if steps.get("started_at") is None else float(steps["started_at"]),
        finished_at=to_epoch(row.finished_at),
        error=row.error,
        error_code=_opt_str(steps.get("error_code")),
        outcome=_opt_str(steps.get("outcome")),
        steps=runs,
    )
    return ProcedureView.of(record)


def _procedure_values(record: ProcedureRecord) -> dict[str, Any]:
    return {
        "kind": record.kind,
        "topic": record.topic,
        "state": record.state.value,
        "step": record.step,
        "attempts": record.attempts,
        "error": record.error,
        "steps": _steps_json(record),
        "submitted_at": to_datetime(record.submitted_at),
        "finished_at": None if record.finished_at is None else to_datetime(record.finished_at),
        "duration_s": None
        if record.finished_at is None
        else max(0.0, record.finished_at - record.submitted_at),
    }


def _chunks(items: list[str], size: int = 500) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class _BatchWriter(Generic[_T]):
    """Writes everything submitted meanwhile in one transaction (many procedures end at once)."""

    def __init__(self, call: Callable[[list[_T]], Awaitable[None]], window: float) -> None:
        self._call = call
        self._window = window
        self._pending: list[tuple[_T, asyncio.Future[None]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, item: _T) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((item, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        await future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(self._window)
            batch, self._pending = self._pending, []
            try:
                await self._call([item for item, _ in batch])
            except Exception as exc:
                for _, f in batch:
                    if not f.done():
                        f.set_exception(exc)
                continue
            for _, f in batch:
                if not f.done():
                    f.set_result(None)


class History:
    """Reads and writes of the three history tables."""

    def __init__(self, engine: Engine, *, batch_window: float = 0.005) -> None:
        self.engine = engine
        self._procedures: _BatchWriter[ProcedureRecord] = _BatchWriter(
            functools.partial(self._call, self._write_procedures), batch_window
        )
        self._purges: _BatchWriter[PurgeRecord] = _BatchWriter(
            functools.partial(self._call, self._write_purges), batch_window
        )

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return await asyncio.to_thread(functools.partial(fn, *args))
        except (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError) as exc:
            # The detail names the server and the user: logged, not answered.
            detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            logger.warning("history database call failed: %s", detail)
            raise Unavailable("history database unavailable") from exc

    # -- procedures ---------------------------------------------------------------------

    async def record_procedure(self, record: ProcedureRecord) -> None:
        """Insert or update the procedure's row (idempotent); batched with concurrent calls."""
        if not record.state.terminal:
            raise ValueError("only terminal procedures go to the history")
        await self._procedures.submit(record)

    def _write_procedures(self, records: list[ProcedureRecord]) -> None:
        t = procedure_history_table
        latest = {r.id: r for r in records}
        with self.engine.begin() as conn:
            existing: set[str] = set()
            for chunk in _chunks(list(latest)):
                q = select(t.c.procedure_id).where(t.c.procedure_id.in_(chunk))
                existing.update(conn.execute(q).scalars())
            for pid in existing:
                values = _procedure_values(latest[pid])
                conn.execute(update(t).where(t.c.procedure_id == pid).values(**values))
            new = [
                {"procedure_id": r.id, **_procedure_values(r)}
                for pid, r in latest.items()
                if pid not in existing
            ]
            if new:
                conn.execute(insert(t), new)

    async def has_procedure(self, procedure_id: str) -> bool:
        """True when the procedure's row exists."""
        t = procedure_history_table

        def _read() -> bool:
            with self.engine.connect() as conn:
                q = select(t.c.procedure_id).where(t.c.procedure_id == procedure_id)
                return conn.execute(q).first() is not None

        return await self._call(_read)

    async def get_procedure(self, procedure_id: str) -> ProcedureView | None:
        """The finished procedure, or None."""
        t = procedure_history_table

        def _read() -> ProcedureView | None:
            with self.engine.connect() as conn:
                row = conn.execute(select(t).where(t.c.procedure_id == procedure_id)).first()
            return None if row is None else _view_of_row(row)

        return await self._call(_read)

    async def list_procedures(
        self,
        *,
        state: ProcedureState | None = None,
        topic: str | None = None,
        limit: int = 100,
    ) -> list[ProcedureView]:
        """Finished procedures, newest first."""
        t = procedure_history_table
        q = select(t).order_by(t.c.submitted_at.desc()).limit(min(limit, MAX_LIMIT))
        if state is not None:
            q = q.where(t.c.state == state.value)
        if topic is not None:
            q = q.where(t.c.topic == topic)

        def _read() -> list[ProcedureView]:
            with self.engine.connect() as conn:
                return [_view_of_row(row) for row in conn.execute(q)]

        return await self._call(_read)

    # -- purges -------------------------------------------------------------------------

    async def record_purge(self, purge: PurgeRecord) -> None:
        """Insert the purge's row unless this procedure already wrote one (batched)."""
        await self._purges.submit(purge)

    def _write_purges(self, purges: list[PurgeRecord]) -> None:
        t = purge_history_table
        by_id = {p.procedure_id: p for p in purges}
        with self.engine.begin() as conn:
            existing: set[str] = set()
            for chunk in _chunks(list(by_id)):
                q = select(t.c.procedure_id).where(t.c.procedure_id.in_(chunk))
                existing.update(conn.execute(q).scalars())
            rows = [
                {
                    "procedure_id": p.procedure_id,
                    "topic": p.topic,
                    "prune_point": p.prune_point,
                    "previous_pruned_entry_id": p.previous_pruned_entry_id,
                    "previous_log_start": p.previous_log_start,
                    "low_watermark": p.low_watermark,
                    "entries_deleted": p.entries_deleted,
                    "bytes_estimated": p.bytes_estimated,
                    "logical_delete": p.logical_delete,
                    "duration_s": p.duration_s,
                    "finished_at": _aware(p.finished_at),
                }
                for pid, p in by_id.items()
                if pid not in existing
            ]
            if rows:
                conn.execute(insert(t), rows)

    async def purges(self, *, topic: str | None = None, limit: int = 100) -> list[PurgeRecord]:
        """Completed purges, newest first."""
        t = purge_history_table
        q = select(t).order_by(t.c.finished_at.desc(), t.c.id.desc()).limit(min(limit, MAX_LIMIT))
        if topic is not None:
            q = q.where(t.c.topic == topic)

        def _read() -> list[PurgeRecord]:
            with self.engine.connect() as conn:
                return [
                    PurgeRecord(
                        procedure_id=row.procedure_id,
                        topic=row.topic,
                        prune_point=row.prune_point,
                        previous_pruned_entry_id=row.previous_pruned_entry_id,
                        previous_log_start=row.previous_log_start,
                        low_watermark=row.low_watermark,
                        entries_deleted=row.entries_deleted,
                        bytes_estimated=row.bytes_estimated,
                        logical_delete=row.logical_delete,
                        duration_s=row.duration_s,
                        finished_at=_aware(row.finished_at),
                    )
                    for row in conn.execute(q)
                ]

        return await self._call(_read)

    async def purge_count(self, *, topic: str | None = None) -> int:
        """How many purges are recorded (for one topic, or all)."""
        t = purge_history_table
        q = select(func.count()).select_from(t)
        if topic is not None:
            q = q.where(t.c.topic == topic)

        def _read() -> int:
            with self.engine.connect() as conn:
                return int(conn.execute(q).scalar_one())

        return await self._call(_read)

    # -- events -------------------------------------------------------------------------

    async def record_event(self, event: WalEvent) -> None:
        """Append one WAL event."""
        await self.record_events([event])

    async def record_events(self, events: list[WalEvent]) -> None:
        """Append WAL events in one transaction (their `id`s are ignored: the table's)."""
        if not events:
            return
        t = wal_events_table
        rows = [
            {
                "topic": e.topic,
                "kind": e.kind,
                "region_id": e.region_id,
                "details": dict(e.details),
                "at": _utc(e.at),
                "procedure_id": e.procedure_id,
                "target": e.target,
                "log_start_before": e.log_start_before,
                "log_start_after": e.log_start_after,
                "high_watermark": e.high_watermark,
                "message": e.message,
            }
            for e in events
        ]

        def _write() -> None:
            with self.engine.begin() as conn:
                conn.execute(insert(t), rows)

        await self._call(_write)

    async def events(
        self,
        *,
        topic: str | None = None,
        kind: str | None = None,
        kinds: Collection[str] = (),
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[WalEvent]:
        """WAL events, newest first: of `topic`, of `kind` or any of `kinds`, at or after
        `since`."""
        t = wal_events_table
        q = select(t).order_by(t.c.at.desc(), t.c.id.desc()).limit(min(limit, MAX_LIMIT))
        if topic is not None:
            q = q.where(t.c.topic == topic)
        wanted = {*kinds, *(() if kind is None else (kind,))}
        if wanted:
            q = q.where(t.c.kind.in_(sorted(wanted)))
        if since is not None:
            q = q.where(t.c.at >= _utc(since))

        def _read() -> list[WalEvent]:
            with self.engine.connect() as conn:
                return [
                    WalEvent(
                        id=row.id,
                        topic=row.topic,
                        kind=row.kind,
                        region_id=row.region_id,
                        details=dict(row.details or {}),
                        at=_aware(row.at),
                        procedure_id=row.procedure_id,
                        target=row.target,
                        log_start_before=row.log_start_before,
                        log_start_after=row.log_start_after,
                        high_watermark=row.high_watermark,
                        message=row.message,
                    )
                    for row in conn.execute(q)
                ]

        return await self._call(_read)

    async def trim_events(self, before: datetime, *, batch: int = 5_000) -> int:
        """Delete the events older than `before`, `batch` rows per transaction (so no
        long lock holds the writers back); returns how many were deleted."""
        t = wal_events_table
        cutoff = _utc(before)

        def _trim() -> int:
            deleted = 0
            while True:
                with self.engine.begin() as conn:
                    ids = select(t.c.id).where(t.c.at < cutoff).order_by(t.c.id).limit(batch)
                    chunk = list(conn.execute(ids).scalars())
                    if chunk:
                        conn.execute(delete(t).where(t.c.id.in_(chunk)))
                deleted += len(chunk)
                if len(chunk) < batch:
                    return deleted

        return await self._call(_trim)
