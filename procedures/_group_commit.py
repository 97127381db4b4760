"""Group commit of kv transactions issued by many concurrent procedures.

A purge cycle runs hundreds of procedures, each persisting its record several times and
moving its topic's marker: thousands of small compare-and-swap transactions, each a
round trip to etcd. Independent transactions that are waiting at the same moment are
merged into ONE transaction whose compares are the union of theirs (the election fence,
shared by all, once) and whose operations are the concatenation of theirs. Merging is
safe because they touch disjoint keys: when the merged transaction succeeds, each one's
compares held and each one's writes applied, atomically. When it fails, some compare did
not hold, so every member is retried alone to learn its own outcome; failures are rare
(a lost CAS, or lost leadership).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from metasrv.kv import Compare, KvBackend, TxnOp, TxnResult

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    compares: Sequence[Compare]
    ops: Sequence[TxnOp]
    future: asyncio.Future[TxnResult]
    keys: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.keys = frozenset(op.key for op in self.ops)


class GroupCommitter:
    """Async `txn()` that merges concurrent, key-disjoint transactions."""

    def __init__(
        self,
        kv: KvBackend,
        executor: Executor | None,
        *,
        window: float = 0.002,
        max_ops: int | None = None,
    ) -> None:
        self._kv = kv
        self._executor = executor
        self._window = window
        self._max_ops = min(max_ops or kv.max_txn_ops, kv.max_txn_ops)
        self._queue: list[_Pending] = []
        self._drainer: asyncio.Task[None] | None = None
        self.batches = 0
        """Merged transactions sent so far (for tests and benchmarks)."""

    async def txn(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult:
        """Apply `ops` if every compare holds; may share one kv transaction with others."""
        if len(compares) >= self._max_ops or len(ops) >= self._max_ops:
            return await self._run(compares, ops)
        loop = asyncio.get_running_loop()
        pending = _Pending(compares, ops, loop.create_future())
        self._queue.append(pending)
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        return await pending.future

    async def _run(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._kv.txn, compares, ops)

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        compares: set[Compare] = set()
        keys: set[str] = set()
        n_ops = 0
        rest: list[_Pending] = []
        for p in self._queue:
            new_compares = compares | set(p.compares)
            fits = len(new_compares) <= self._max_ops and n_ops + len(p.ops) <= self._max_ops
            if batch and (not fits or not keys.isdisjoint(p.keys)):
                rest.append(p)
                continue
            batch.append(p)
            compares = new_compares
            keys |= p.keys
            n_ops += len(p.ops)
        self._queue = rest
        return batch

    async def _drain(self) -> None:
        while self._queue:
            await asyncio.sleep(self._window)
            # One batch at a time: transactions on the same key commit in submission order.
            await self._commit(self._take_batch())

    async def _commit(self, batch: list[_Pending]) -> None:
        if len(batch) == 1:
            await self._commit_alone(batch[0])
            return
        merged: dict[Compare, None] = {}
        ops: list[TxnOp] = []
        for p in batch:
            merged.update(dict.fromkeys(p.compares))
            ops.extend(p.ops)
        self.batches += 1
        try:
            result = await self._run(list(merged), ops)
        except Exception as exc:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        if result.succeeded:
            for p in batch:
                if not p.future.done():
                    p.future.set_result(result)
            return
        # Some member's compare failed: find out whose, one transaction each.
        await asyncio.gather(*(self._commit_alone(p) for p in batch))

    async def _commit_alone(self, p: _Pending) -> None:
        try:
            result = await self._run(p.compares, p.ops)
        except Exception as exc:
            if not p.future.done():
                p.future.set_exception(exc)
            return
        if not p.future.done():
            p.future.set_result(result)
