"""Finished procedure records: each written to the SQL history once, and deleted from the
kv backend `procedure.finished_ttl` after it ended (`FinishedRecords`).

A procedure's end writes its history row at once (`record`); when that write fails, the
kv record stays and the sweep, a background task on the leader, writes it later. The
sweep also deletes the kv records whose TTL has passed, so the kv backend holds only
unfinished and recent procedures while SQL keeps them for good. Every unfinished record
it reads is handed to `adopt` (the manager runs it if no task of its does: a run given
up after kv failures, a create whose answer was lost), so such a record waits one sweep
interval at most, not for the next leader.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from metasrv.errors import MetasrvError
from metasrv.process import PeriodicLoop, log_only
from metasrv.settings import ProcedureSettings
from procedures._history import History
from procedures._procedure import ProcedureRecord
from procedures._store import ProcedureStore, Stored

logger = logging.getLogger(__name__)


class FinishedRecords(PeriodicLoop):
    """History rows and kv expiry of finished procedures; the sweep is a loop on the
    ticker, every quarter of `procedure.finished_ttl` (0.5 s to 1 min)."""

    task_name = "procedure-sweeper"

    def __init__(
        self,
        store: ProcedureStore,
        history: History,
        settings: ProcedureSettings,
        *,
        leading: Callable[[], bool],
        forget: Callable[[str], None],
        adopt: Callable[[Stored], object] = lambda _stored: None,
    ) -> None:
        super().__init__(log_only("procedure_sweeper"))
        self._store = store
        self._history = history
        self._settings = settings
        self._leading = leading
        """Whether this process runs procedures now (only the leader sweeps)."""
        self._forget = forget
        """Called with the id of every record the sweep deleted."""
        self._adopt = adopt
        """Called with every unfinished record the sweep read."""
        self._written: set[str] = set()
        """Records whose history row is known to exist."""

    def next_round_in(self) -> float:
        return max(0.5, min(60.0, self._settings.finished_ttl / 4))

    async def round(self) -> None:
        if self._leading():
            await self.sweep()

    async def record(self, record: ProcedureRecord) -> None:
        """Write the history row of a procedure that just ended; on failure the sweep
        writes it later (the kv record stays until then)."""
        try:
            await self._history.record_procedure(record)
            self._written.add(record.id)
        except MetasrvError as exc:
            logger.warning(
                "procedure history not written yet: %s",
                exc,
                extra={"procedure_id": record.id},
            )

    async def sweep(self, now: float | None = None) -> int:
        """Write missing history rows; delete finished kv records older than the TTL;
        return how many were deleted."""
        now = time.time() if now is None else now
        ttl = self._settings.finished_ttl
        removed = 0
        found = await self._store.scan()
        # Adopted first: a history write failing below must not keep them waiting.
        for stored in found:
            if not stored.record.state.terminal:
                self._adopt(stored)
        for stored in found:
            record = stored.record
            if not record.state.terminal:
                continue
            if record.id not in self._written:
                if not await self._history.has_procedure(record.id):
                    await self._history.record_procedure(record)
                self._written.add(record.id)
            expired = record.finished_at is not None and record.finished_at + ttl <= now
            if expired and await self._store.delete(record.id, stored.revision):
                removed += 1
                self._written.discard(record.id)
                self._forget(record.id)
        return removed
