"""Pure checks of how Kafka's answers are read: a partition without a live leader is named,
and a batched offsets answer fails only the topics it failed. No services."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin._metadata import (
    BrokerMetadata,
    ClusterMetadata,
    PartitionMetadata,
    TopicMetadata,
)

from metasrv.errors import KafkaUnavailable, MetasrvError
from metasrv.kafka import leader_problem
from procedures.wal_purge import Coalescer


def _metadata(
    leader: int, *, brokers: tuple[int, ...] = (1, 2, 3), error: int | None = None
) -> ClusterMetadata:
    md = ClusterMetadata()
    md.brokers = {b: BrokerMetadata() for b in brokers}
    part = PartitionMetadata()
    part.id, part.leader, part.replicas, part.isrs = 0, leader, [1, 2, 3], [1, 2, 3]
    part.error = None if error is None else KafkaError(error)
    topic = TopicMetadata()
    topic.topic, topic.partitions = "wal_0", {0: part}
    md.topics = {"wal_0": topic}
    return md


def test_a_partition_with_a_live_leader_is_readable() -> None:
    assert leader_problem(_metadata(2), "wal_0") is None
    # A follower down (REPLICA_NOT_AVAILABLE) leaves the partition readable.
    assert leader_problem(_metadata(2, error=KafkaError.REPLICA_NOT_AVAILABLE), "wal_0") is None


@pytest.mark.parametrize(
    ("md", "says"),
    [
        (_metadata(-1), "has no leader"),
        (_metadata(3, brokers=(1, 2)), "leader 3 is not a live broker"),
        (_metadata(2, error=KafkaError.LEADER_NOT_AVAILABLE), "LEADER_NOT_AVAILABLE"),
    ],
)
def test_a_partition_without_a_live_leader_is_named(md: ClusterMetadata, says: str) -> None:
    problem = leader_problem(md, "wal_0")
    assert problem is not None and says in problem


async def test_a_batch_answer_fails_only_the_topics_kafka_failed() -> None:
    down = KafkaUnavailable("list_offsets wal_1: Kafka answered offset -1001")
    calls: list[set[str]] = []

    def call(args: dict[str, None]) -> dict[str, int | MetasrvError]:
        calls.append(set(args))
        return {"wal_0": 7, "wal_1": down}

    coalescer: Coalescer[None, int] = Coalescer(call, lambda a, b: None, window=0.01)
    ok = asyncio.ensure_future(coalescer.submit_topic("wal_0", None))
    failed = asyncio.ensure_future(coalescer.submit_topic("wal_1", None))
    assert await ok == 7
    with pytest.raises(KafkaUnavailable) as raised:
        await failed
    assert raised.value is down
    assert calls == [{"wal_0", "wal_1"}]  # one batched call, no topic-by-topic retry
