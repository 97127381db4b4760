"""Coalescing of Kafka admin calls made by many concurrent procedures.

Each purge procedure works on one topic, but a purge cycle runs hundreds of them at
once. Issuing one ListOffsets, OffsetFetch (pinned groups) or DeleteRecords round trip per
topic would make a cycle over 1,024 topics take thousands of broker round trips; instead
every request waiting at
the same moment joins one batched admin call (the adapter already batches per call), by
the micro-batching the kv group commit uses (`procedures.MicroBatcher`). A batch that
fails as a whole is retried topic by topic, so one bad topic's error reaches only the
procedure that asked about it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

from metasrv.errors import KafkaUnavailable, MetasrvError
from metasrv.kafka import KafkaAdmin
from metasrv.model import PartitionOffsets
from procedures import MicroBatcher, Pending

logger = logging.getLogger(__name__)

A = TypeVar("A")
R = TypeVar("R")

Committed = dict[str, int | None]
"""A topic's committed offset of each pinned consumer group on partition 0 (None: none)."""


class Coalescer(MicroBatcher[tuple[str, A], R]):
    """Runs `call({topic: arg})` in a thread for every request pending at flush time (the
    args of one topic merged with `merge`); a topic whose answer is an error fails only
    the requests about that topic."""

    def __init__(
        self,
        call: Callable[[dict[str, A]], Mapping[str, R | MetasrvError]],
        merge: Callable[[A, A], A],
        *,
        window: float,
    ) -> None:
        super().__init__(window=window)
        self._call = call
        self._merge = merge

    async def submit_topic(self, topic: str, arg: A) -> R:
        """The answer about `topic`, asked with `arg`."""
        return await self.submit((topic, arg))

    async def serve(self, batch: list[Pending[tuple[str, A], R]]) -> None:
        by_topic: dict[str, tuple[A, list[Pending[tuple[str, A], R]]]] = {}
        for p in batch:
            topic, arg = p.request
            held = by_topic.get(topic)
            by_topic[topic] = (
                (arg, [p]) if held is None else (self._merge(held[0], arg), [*held[1], p])
            )
        args = {topic: arg for topic, (arg, _) in by_topic.items()}
        try:
            results = await asyncio.to_thread(self._call, args)
        except MetasrvError:
            if len(args) == 1:
                raise
            await asyncio.gather(*(self._one(t, a, ps) for t, (a, ps) in by_topic.items()))
            return
        for topic, (_, pendings) in by_topic.items():
            self._answer(topic, results, pendings)

    async def _one(self, topic: str, arg: A, pendings: list[Pending[tuple[str, A], R]]) -> None:
        try:
            result = await asyncio.to_thread(self._call, {topic: arg})
        except MetasrvError as exc:
            for p in pendings:
                p.answer(exc)
            return
        self._answer(topic, result, pendings)

    @staticmethod
    def _answer(
        topic: str,
        results: Mapping[str, R | MetasrvError],
        pendings: list[Pending[tuple[str, A], R]],
    ) -> None:
        answer = results.get(topic, MetasrvError(f"no answer from Kafka for topic {topic}"))
        for p in pendings:
            p.answer(answer)


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
        # One request per pinned group for every topic asked at the same moment.
        self._committed: Coalescer[frozenset[str], Committed] = Coalescer(
            self._committed_call, frozenset.union, window=window
        )

    def _committed_call(
        self, args: dict[str, frozenset[str]]
    ) -> Mapping[str, Committed | MetasrvError]:
        groups = frozenset().union(*args.values())
        return self.admin.committed_offsets(groups, args.keys())

    async def offsets(self, topic: str) -> PartitionOffsets:
        """Log start offset and high watermark of the topic's partition 0, and Kafka's
        topic id, read with them in the same batch (never cached: a recreated topic shows)."""
        return await self._offsets.submit_topic(topic, None)

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

    async def committed(self, topic: str, groups: frozenset[str]) -> Committed:
        """Each of `groups`' committed offset on the topic's partition 0 (None: none), read
        now (never cached: a group's offset moves forward as it reads); raises the Kafka
        adapter's error (`KafkaUnavailable` when retryable)."""
        answer = await self._committed.submit_topic(topic, groups)
        return {g: answer.get(g) for g in groups}

    async def committed_tolerant(
        self, topics: list[str], groups: frozenset[str], *, timeout: float
    ) -> tuple[dict[str, Committed], dict[str, MetasrvError]]:
        """`committed` of many topics in one request per group, answered within `timeout`
        seconds: (the topics Kafka answered, the error of each it did not); never raises a
        Kafka error (as `offsets_tolerant`)."""
        try:
            answers = await asyncio.wait_for(
                asyncio.to_thread(self.admin.committed_offsets, groups, topics, timeout=timeout),
                timeout + 1.0,
            )
        except TimeoutError:
            late = KafkaUnavailable(f"no committed offsets from Kafka within {timeout:g}s")
            return {}, dict.fromkeys(topics, late)
        except MetasrvError as exc:
            return {}, dict.fromkeys(topics, exc)
        found = {t: a for t, a in answers.items() if not isinstance(a, MetasrvError)}
        failed = {t: a for t, a in answers.items() if isinstance(a, MetasrvError)}
        for topic in topics:
            if topic not in found and topic not in failed:
                failed[topic] = KafkaUnavailable(f"no committed offsets from Kafka for {topic}")
        return found, failed

    async def delete_records(self, topic: str, offset: int) -> int:
        """DeleteRecords(topic, 0, offset); returns the low watermark after it."""
        return await self._deletes.submit_topic(topic, offset)
