"""Persistence of procedure records in the kv backend.

One key per procedure, `__procedure__/{id}/state`, holding the whole `ProcedureRecord`
as JSON. Every write is a transaction guarded by (a) a compare on the key's
`mod_revision`, so two runners can never interleave their writes to one procedure, and
(b) the election fence, so a deposed leader's write is refused by the store itself
rather than by a check it made a moment earlier.

Submitting a procedure creates its record and its kv locks (e.g.
`__remote_wal_lock/{topic}` -> `{"procedure_id": ...}`) in one transaction that requires
the locks to be absent: at most one purge per topic exists at any time, whichever
process (or leader term) submitted it. The terminal write deletes the locks it still
owns in the same transaction.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from metasrv import keys
from metasrv.errors import Conflict, KvUnavailable, LeadershipLost, MetasrvError
from metasrv.kv import Compare, Delete, KvBackend, Put, TxnOp, TxnResult
from procedures._group_commit import GroupCommitter
from procedures._procedure import ProcedureRecord

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

STATE_SUFFIX = "state"


def state_key(procedure_id: str) -> str:
    """`__procedure__/{id}/state`"""
    return f"{keys.procedure_prefix(procedure_id)}{STATE_SUFFIX}"


_CREATE_ATTEMPTS = 3
"""Tries of `create` while locks are released under it (each try is one kv txn)."""


class RecordConflict(Conflict):
    """Someone else wrote the procedure's record since we read it (lost CAS)."""

    code = "procedure_conflict"


@dataclass(frozen=True, slots=True)
class Stored:
    """A record and the kv revision it was read or written at."""

    record: ProcedureRecord
    revision: int
    """Its key's `mod_revision` (the CAS token for the next write)."""


@dataclass(frozen=True, slots=True)
class Created:
    """Outcome of `ProcedureStore.create`."""

    created: bool
    """False when a kv lock was already held by another procedure."""
    procedure_id: str
    """The new procedure's id, or the id of the one holding the lock."""
    revision: int
    """Revision of the new record (0 when not created)."""


class ProcedureStore:
    """Async access to procedure records; kv calls run on `executor` (default pool if None)."""

    def __init__(
        self,
        kv: KvBackend,
        fence: Callable[[], Sequence[Compare]],
        *,
        executor: Executor | None = None,
        committer: GroupCommitter | None = None,
    ) -> None:
        self._kv = kv
        self._fence = fence
        self._executor = executor
        self._committer = committer

    async def _txn(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult:
        if self._committer is not None:
            return await self._committer.txn(compares, ops)
        return await self._call(self._kv.txn, compares, ops)

    async def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        loop = asyncio.get_running_loop()
        try:
            call = functools.partial(fn, *args, **kwargs)
            return await loop.run_in_executor(self._executor, call)
        except MetasrvError:
            raise
        except OSError as exc:
            raise KvUnavailable(f"kv backend call failed: {exc}") from exc

    # -- reads --------------------------------------------------------------------------

    async def load(self, procedure_id: str) -> Stored | None:
        """The stored record, or None."""
        kv = await self._call(self._kv.get, state_key(procedure_id))
        if kv is None:
            return None
        return Stored(ProcedureRecord.from_json(kv.value), kv.mod_revision)

    async def scan(self) -> list[Stored]:
        """Every procedure record in the kv backend (unfinished and recently finished)."""

        def _scan() -> list[Stored]:
            out: list[Stored] = []
            for kv in self._kv.scan(keys.PROCEDURE_PREFIX):
                if not kv.key.endswith("/" + STATE_SUFFIX):
                    continue
                try:
                    out.append(Stored(ProcedureRecord.from_json(kv.value), kv.mod_revision))
                except (ValueError, KeyError, TypeError):
                    # A record we cannot parse is left for an operator; never guessed at.
                    logger.error("unreadable procedure record", extra={"key": kv.key})
            return out

        return await self._call(_scan)

    async def lock_holder(self, lock_key: str) -> str | None:
        """Id of the procedure holding a kv lock, or None."""
        kv = await self._call(self._kv.get, lock_key)
        if kv is None:
            return None
        return str(orjson.loads(kv.value).get("procedure_id"))

    # -- writes -------------------------------------------------------------------------

    async def create(self, record: ProcedureRecord) -> Created:
        """Create the record and its kv locks atomically, unless a lock is taken.

        A write whose answer was lost (`KvUnavailable`: it may or may not have landed) is
        settled by reading the record back: found, the create is done (nothing else
        writes a new id's key); absent, it is tried again. When the record cannot be
        read either, `KvUnavailable` is raised: a landed record is then run by the
        manager's adoption (`ProcedureManager.adopt`), never left to the next leader.
        """
        key = state_key(record.id)
        holder_value = orjson.dumps({"procedure_id": record.id})
        ops: list[TxnOp] = [Put(key, record.to_json())]
        ops += [Put(lock, holder_value) for lock in record.kv_locks]
        unknown: KvUnavailable | None = None
        for _ in range(_CREATE_ATTEMPTS):
            compares = [Compare(key, revision=0)]
            compares += [Compare(lock, revision=0) for lock in record.kv_locks]
            compares += list(self._fence())
            try:
                result = await self._txn(compares, ops)
            except KvUnavailable as exc:
                unknown = exc
                landed = await self._landed(record)
                if landed is None:
                    continue  # the write did not land: try it again
                return landed
            if result.succeeded:
                return Created(True, record.id, result.revision)
            if unknown is not None:
                # An earlier try's write may have landed after all (its compare fails
                # this one): the locks then name us, and the record is ours.
                landed = await self._landed(record)
                if landed is not None:
                    return landed
            for lock in record.kv_locks:
                holder = await self.lock_holder(lock)
                if holder is not None:
                    return Created(False, holder, 0)
            if await self._call(self._kv.get, key) is not None:
                raise RecordConflict(f"procedure {record.id} already exists")
            # No lock is held now and the key is free: either the fence failed (we no
            # longer lead) or a lock was released between our txn and our read of it
            # (its procedure finished). Only the fence alone tells which.
            if not (await self._txn(list(self._fence()), [])).succeeded:
                break
        else:
            if unknown is not None:
                raise unknown
        raise LeadershipLost("not leader any more; procedure not submitted")

    async def _landed(self, record: ProcedureRecord) -> Created | None:
        """The create of `record` as stored, if its write landed (read back after an
        unknown outcome); None if its key is absent."""
        stored = await self.load(record.id)
        if stored is None:
            return None
        if stored.record.submitted_at != record.submitted_at or stored.record.kind != record.kind:
            raise RecordConflict(f"procedure {record.id} already exists")
        logger.warning(
            "procedure create had an unknown outcome; its record is stored",
            extra={"procedure_id": record.id, "topic": record.topic},
        )
        return Created(True, record.id, stored.revision)

    async def save(self, record: ProcedureRecord, revision: int) -> int:
        """Write `record` if its key is still at `revision`; return the new revision.

        A terminal record also drops the kv locks that still name this procedure.
        """
        key = state_key(record.id)
        compares = [Compare(key, revision=revision), *self._fence()]
        put: list[TxnOp] = [Put(key, record.to_json())]
        if record.state.terminal and record.kv_locks:
            # Drop the locks only while they still name us; normally they do, so try that
            # in the same transaction and fall back to the record alone if not.
            mine = orjson.dumps({"procedure_id": record.id})
            guarded = [*compares, *(Compare(lock, value=mine) for lock in record.kv_locks)]
            unlock = [Delete(lock) for lock in record.kv_locks]
            result = await self._txn(guarded, [*put, *unlock])
            if result.succeeded:
                return result.revision
            current = await self._call(self._kv.get, key)
            if current is None or current.mod_revision != revision:
                await self._explain_failure(key, revision, record.id)
            logger.warning(
                "procedure lock no longer ours; finishing without releasing it",
                extra={"procedure_id": record.id, "locks": list(record.kv_locks)},
            )
        result = await self._txn(compares, put)
        if result.succeeded:
            return result.revision
        await self._explain_failure(key, revision, record.id)
        raise AssertionError("unreachable")  # pragma: no cover

    async def delete(self, procedure_id: str, revision: int) -> bool:
        """Remove a (finished) record if unchanged since `revision`; False if it changed."""
        key = state_key(procedure_id)
        result = await self._txn([Compare(key, revision=revision), *self._fence()], [Delete(key)])
        if result.succeeded:
            return True
        current = await self._call(self._kv.get, key)
        if current is None or current.mod_revision != revision:
            return False
        raise LeadershipLost("not leader any more; finished procedure record kept")

    async def _explain_failure(self, key: str, revision: int, procedure_id: str) -> None:
        current = await self._call(self._kv.get, key)
        if current is None or current.mod_revision != revision:
            raise RecordConflict(
                f"procedure {procedure_id} was changed by another writer "
                f"(expected revision {revision}, found "
                f"{None if current is None else current.mod_revision})"
            )
        raise LeadershipLost(f"not leader any more; procedure {procedure_id} not persisted")
