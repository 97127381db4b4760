"""Kafka's topic id comes with every offsets answer, read afresh: a topic deleted and
recreated under the same name answers a new id at once, through the adapter and through
the purge's batched calls. Real Kafka."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import TopicCollection

from metasrv.errors import MetasrvError
from metasrv.kafka import KafkaAdmin
from procedures.wal_purge import KafkaBatcher
from tests._wait import eventually
from tests.api._live import produce
from tests.metasrv.kafka._recreate import recreate_topic


def test_offsets_carry_the_topic_id_and_a_recreated_topic_gets_a_new_one(
    kafka_admin: KafkaAdmin, kafka_bootstrap: str, kafka_topic: str, unique_prefix: str
) -> None:
    other = f"{unique_prefix}-other"
    kafka_admin.ensure_topics([other])
    try:
        produce(kafka_bootstrap, kafka_topic, 5)
        first = kafka_admin.offsets([kafka_topic, other])
        assert first[kafka_topic].topic_id is not None
        assert first[other].topic_id is not None
        assert first[kafka_topic].topic_id != first[other].topic_id
        assert first[kafka_topic].high_watermark == 5

        old, new = recreate_topic(kafka_admin, kafka_topic)

        assert old == first[kafka_topic].topic_id
        assert new != old
        again = kafka_admin.offsets([kafka_topic, other])
        assert again[kafka_topic].topic_id == new
        assert again[kafka_topic].high_watermark == 0  # a new topic: offsets start over
        assert again[other].topic_id == first[other].topic_id  # untouched
    finally:
        kafka_admin.delete_topics([other])


def test_a_missing_topic_is_an_error_not_an_id(
    kafka_admin: KafkaAdmin, kafka_topic: str, unique_prefix: str
) -> None:
    answers = kafka_admin.offsets_each([kafka_topic, f"{unique_prefix}-absent"])
    assert not isinstance(answers[kafka_topic], MetasrvError)
    assert isinstance(answers[f"{unique_prefix}-absent"], MetasrvError)


async def test_the_batched_offsets_carry_the_current_topic_id(
    kafka_admin: KafkaAdmin, kafka_topic: str
) -> None:
    batcher = KafkaBatcher(kafka_admin)
    before = await batcher.offsets(kafka_topic)
    old, new = await asyncio.to_thread(recreate_topic, kafka_admin, kafka_topic)
    assert before.topic_id == old

    after = await batcher.offsets(kafka_topic)
    found, failed = await batcher.offsets_tolerant([kafka_topic], timeout=5.0)

    assert failed == {}
    assert after.topic_id == new
    assert found[kafka_topic].topic_id == new


@pytest.mark.parametrize("count", [1, 40])
async def test_one_describe_per_batch_of_topics(
    kafka_admin: KafkaAdmin, unique_prefix: str, count: int
) -> None:
    """Many topics' ids in one batched call: no second round trip per topic."""
    topics = [f"{unique_prefix}-b{n}" for n in range(count)]
    kafka_admin.ensure_topics(topics)
    await eventually(
        lambda: (
            not any(isinstance(a, MetasrvError) for a in kafka_admin.offsets_each(topics).values())
        ),
        "the new topics readable",
        interval=0.1,
    )
    calls: list[int] = []
    client = kafka_admin._client
    describe = client.describe_topics

    def counted(collection: TopicCollection, **kwargs: Any) -> dict[str, Future[Any]]:
        calls.append(len(collection.topic_names))
        return describe(collection, **kwargs)

    client.describe_topics = counted  # type: ignore[method-assign,assignment]
    try:
        found, failed = await KafkaBatcher(kafka_admin).offsets_tolerant(topics, timeout=5.0)
    finally:
        kafka_admin.delete_topics(topics)
    assert failed == {}
    assert len({o.topic_id for o in found.values()}) == count
    assert calls == [count]
