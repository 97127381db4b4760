"""Coalescing of Kafka admin calls made by many concurrent procedures.

Each purge procedure works on one topic, but a purge cycle runs hundreds of them at
once. Issuing one ListOffsets/DeleteRecords round trip per topic would make a cycle over
1,024 topics take thousands of broker round trips; instead every request waiting at
the same moment joins one batched admin call (the adapter already batches per call).
A batch that fails as a whole is retried topic by topic, so one bad topic's error
reaches only the procedure that asked about it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from metasrv.errors import KafkaUnavailable, MetasrvError
from metasrv.kafka import KafkaAdmin
from metasrv.model import PartitionOffsets

logger = logging.getLogger(__name__)

A = TypeVar("A")
R = TypeVar("R")

_Batch = dict[str, tuple[A, list["asyncio.Future[R]"]]]


class Coalescer(Generic[A, R]):
    """Runs `call({topic: arg})` in a thread for every request pending at flush time; a
    topic whose answer is an error fails only the requests about that topic."""

    def __init__(
        self,
        call: Callable[[dict[str, A]], Mapping[str, R | MetasrvError]],
        merge: Callable[[A, A], A],
        *,
        window: float,
    ) -> None:
        self._call = call
        self._merge = merge
        self._window = window
        self._pending: _Batch[A, R] = {}
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, topic: str, arg: A) -> R:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        entry = self._pending.get(topic)
        if entry is None:
            self._pending[topic] = (arg, [future])
        else:
            self._pending[topic] = (self._merge(entry[0], arg), [*entry[1], future])
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            # A short pause lets every procedure that is about to ask join this batch.
            await asyncio.sleep(self._window)
            batch, self._pending = self._pending, {}
            args = {topic: arg for topic, (arg, _) in batch.items()}
            try:
                results = await asyncio.to_thread(self._call, args)
            except MetasrvError as exc:
                if len(args) == 1:
                    self._fail(batch, exc)
                    continue
                await self._one_by_one(batch)
                continue
            except BaseException as exc:
                self._fail(batch, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for topic, (_, futures) in batch.items():
                if topic in results:
                    self._resolve(futures, results[topic])
                else:
                    self._reject(futures, MetasrvError(f"no answer from Kafka for topic {topic}"))

    async def _one_by_one(self, batch: _Batch[A, R]) -> None:
        async def one(topic: str, arg: A, futures: list[asyncio.Future[R]]) -> None:
            try:
                result = await asyncio.to_thread(self._call, {topic: arg})
            except MetasrvError as exc:
                self._reject(futures, exc)
                return
            if topic in result:
                self._resolve(futures, result[topic])
            else:
                self._reject(futures, MetasrvError(f"no answer from Kafka for topic {topic}"))

        await asyncio.gather(*(one(t, a, fs) for t, (a, fs) in batch.items()))

    @staticmethod
    def _resolve(futures: list[asyncio.Future[R]], value: R | MetasrvError) -> None:
        for f in futures:
            if f.done():
                continue
            if isinstance(value, MetasrvError):
                f.set_exception(value)
            else:
                f.set_result(value)

    @staticmethod
    def _reject(futures: list[asyncio.Future[R]], exc: BaseException) -> None:
        for f in futures:
            if not f.done():
                f.set_exception(exc)

    def _fail(self, batch: _Batch[A, R], exc: BaseException) -> None:
        for _, futures in batch.values():
            self._reject(futures, exc)


class KafkaBatcher:
    """Async front of `KafkaAdmin` that merges concurrent per-topic requests."""

    def __init__(self, admin: KafkaAdmin, *, window: float = 0.005) -> None:
        self.admin = admin
        self._offsets: Coalescer[None, PartitionOffsets] = Coalescer(
            lambda args: admin.offsets_each(args.keys()), lambda a, b: None, window=window
        )
        # Two procedures never purge one topic at once; if they did, the higher offset
        # wins and both learn the resulting low watermark.
        self._deletes: Coalescer[int, int] = Coalescer(admin.delete_records, max, window=window)

    async def offsets(self, topic: str) -> PartitionOffsets:
        """Log start offset and high watermark of the topic's partition 0, and Kafka's
        topic id, read with them in the same batch (never cached: a recreated topic shows)."""
        return await self._offsets.submit(topic, None)

    async def offsets_tolerant(
        self, topics: list[str], *, timeout: float
    ) -> tuple[dict[str, PartitionOffsets], dict[str, MetasrvError]]:
        """Offsets and topic ids of many topics in one batched admin call (the ticker's and
        the API's view of every topic; one DescribeTopics for all of them, in flight with
        the offsets requests), answered within `timeout` seconds: (offsets of the topics Kafka
        answered, the error of each topic it did not). Never raises a Kafka error: a topic
        without offsets is planned as Kafka unavailable."""
        try:
            answers = await asyncio.wait_for(
                asyncio.to_thread(self.admin.offsets_each, topics, timeout=timeout),
                # The adapter keeps to `timeout`; this bounds a call stuck in the library.
                timeout + 1.0,
            )
        except TimeoutError:
            late = KafkaUnavailable(f"no answer from Kafka within {timeout:g}s")
            return {}, dict.fromkeys(topics, late)
        except MetasrvError as exc:
            return {}, dict.fromkeys(topics, exc)
        found = {t: a for t, a in answers.items() if isinstance(a, PartitionOffsets)}
        failed = {t: a for t, a in answers.items() if isinstance(a, MetasrvError)}
        for topic in topics:
            if topic not in found and topic not in failed:
                failed[topic] = KafkaUnavailable(f"no answer from Kafka for topic {topic}")
        return found, failed

    async def delete_records(self, topic: str, offset: int) -> int:
        """DeleteRecords(topic, 0, offset); returns the low watermark after it."""
        return await self._deletes.submit(topic, offset)
