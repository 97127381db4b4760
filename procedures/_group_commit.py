"""Group commit: requests made at about the same moment, served as one.

A purge cycle runs hundreds of procedures at once, each persisting its record several
times, moving its topic's marker and asking Kafka for offsets and deletions: thousands of
small requests, each a round trip. `MicroBatcher` is the one mechanism that lets them
share round trips: a request waits at most `window` seconds for others to join it, then
its batch is served in one call; batches are served one at a time, in the order of their
first request. Its two uses:

- `GroupCommitter` (here): independent kv transactions waiting at the same moment are
  merged into ONE transaction whose compares are the union of theirs (the election fence,
  shared by all, once) and whose operations are the concatenation of theirs. Merging is
  safe because they touch disjoint keys: when the merged transaction succeeds, each one's
  compares held and each one's writes applied, atomically. When it fails, some compare
  did not hold, so every member is retried alone to learn its own outcome; failures are
  rare (a lost CAS, or lost leadership).
- `Coalescer` (`procedures/wal_purge/_batcher.py`): per-topic Kafka admin calls joined
  into one batched call, a failed batch retried topic by topic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from metasrv.kv import Compare, KvBackend, TxnOp, TxnResult

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Pending(Generic[T, R]):
    """One request waiting in a `MicroBatcher` and the future its answer goes to."""

    request: T
    future: asyncio.Future[R]

    def answer(self, result: R | BaseException) -> None:
        """Set the result (an exception fails the request); a second answer is ignored."""
        if self.future.done():
            return
        if isinstance(result, BaseException):
            self.future.set_exception(result)
        else:
            self.future.set_result(result)


class MicroBatcher(Generic[T, R]):
    """Requests waiting at the same moment served together (see the module docstring).

    A subclass says how to serve a batch (`serve`: answer each request) and may say which
    of the waiting requests fit one batch (`take`; by default all of them). An exception
    `serve` lets through fails every request of the batch it has not answered.
    """

    def __init__(self, *, window: float) -> None:
        self._window = window
        self._queue: list[Pending[T, R]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, request: T) -> R:
        """Queue `request` for the next batch; its answer."""
        loop = asyncio.get_running_loop()
        pending: Pending[T, R] = Pending(request, loop.create_future())
        self._queue.append(pending)
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        return await pending.future

    def take(self, queue: list[Pending[T, R]]) -> tuple[list[Pending[T, R]], list[Pending[T, R]]]:
        """(the next batch, the requests left waiting), in submission order."""
        return queue, []

    async def serve(self, batch: list[Pending[T, R]]) -> None:
        """Serve `batch`, answering each of its requests."""
        raise NotImplementedError

    async def _drain(self) -> None:
        while self._queue:
            # A short pause lets every request that is about to come join this batch.
            await asyncio.sleep(self._window)
            batch, self._queue = self.take(self._queue)
            try:
                await self.serve(batch)
            except BaseException as exc:
                for pending in batch:
                    pending.answer(exc)
                if not isinstance(exc, Exception):
                    raise  # cancelled: the requests of this batch were failed first


@dataclass(frozen=True)
class _Txn:
    compares: Sequence[Compare]
    ops: Sequence[TxnOp]
    keys: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", frozenset(op.key for op in self.ops))


class GroupCommitter(MicroBatcher[_Txn, TxnResult]):
    """Async `txn()` that merges concurrent, key-disjoint transactions."""

    def __init__(
        self,
        kv: KvBackend,
        executor: Executor | None,
        *,
        window: float = 0.002,
        max_ops: int | None = None,
    ) -> None:
        super().__init__(window=window)
        self._kv = kv
        self._executor = executor
        self._max_ops = min(max_ops or kv.max_txn_ops, kv.max_txn_ops)
        self.batches = 0
        """Merged transactions sent so far (for tests and benchmarks)."""

    async def txn(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult:
        """Apply `ops` if every compare holds; may share one kv transaction with others."""
        if len(compares) >= self._max_ops or len(ops) >= self._max_ops:
            return await self._run(compares, ops)
        return await self.submit(_Txn(compares, ops))

    async def _run(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._kv.txn, compares, ops)

    def take(
        self, queue: list[Pending[_Txn, TxnResult]]
    ) -> tuple[list[Pending[_Txn, TxnResult]], list[Pending[_Txn, TxnResult]]]:
        """As many as fit one transaction with disjoint keys; the rest wait for the next
        batch, so transactions on the same key commit in submission order."""
        batch: list[Pending[_Txn, TxnResult]] = []
        compares: set[Compare] = set()
        keys: set[str] = set()
        n_ops = 0
        rest: list[Pending[_Txn, TxnResult]] = []
        for p in queue:
            txn = p.request
            new_compares = compares | set(txn.compares)
            fits = len(new_compares) <= self._max_ops and n_ops + len(txn.ops) <= self._max_ops
            if batch and (not fits or not keys.isdisjoint(txn.keys)):
                rest.append(p)
                continue
            batch.append(p)
            compares = new_compares
            keys |= txn.keys
            n_ops += len(txn.ops)
        return batch, rest

    async def serve(self, batch: list[Pending[_Txn, TxnResult]]) -> None:
        if len(batch) == 1:
            await self._commit_alone(batch[0])
            return
        merged: dict[Compare, None] = {}
        ops: list[TxnOp] = []
        for p in batch:
            merged.update(dict.fromkeys(p.request.compares))
            ops.extend(p.request.ops)
        self.batches += 1
        try:
            result = await self._run(list(merged), ops)
        except Exception as exc:
            for p in batch:
                p.answer(exc)
            return
        if result.succeeded:
            for p in batch:
                p.answer(result)
            return
        # Some member's compare failed: find out whose, one transaction each.
        await asyncio.gather(*(self._commit_alone(p) for p in batch))

    async def _commit_alone(self, p: Pending[_Txn, TxnResult]) -> None:
        try:
            result = await self._run(p.request.compares, p.request.ops)
        except Exception as exc:
            p.answer(exc)
            return
        p.answer(result)
