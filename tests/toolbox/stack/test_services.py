"""The stack's services answer the requests the product relies on (real Kafka and etcd)."""

from __future__ import annotations

import pyetcd
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from metasrv.kafka import KafkaAdmin


def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failures.append(err)

    for i in range(count):
        producer.produce(topic, value=f"entry-{i}".encode(), key=b"r1", on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert failures == []


def test_delete_records_moves_log_start_and_old_offsets_are_out_of_range(
    kafka_admin: KafkaAdmin, kafka_topic: str, kafka_bootstrap: str, unique_prefix: str
) -> None:
    admin, topic = kafka_admin, kafka_topic
    _produce(kafka_bootstrap, topic, 1000)
    before = admin.offsets([topic])[topic]
    assert (before.log_start_offset, before.high_watermark) == (0, 1000)

    assert admin.delete_records({topic: 500}) == {topic: 500}
    after = admin.offsets([topic])[topic]
    assert (after.log_start_offset, after.high_watermark) == (500, 1000)

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"{unique_prefix}-reader",
            "auto.offset.reset": "error",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 10)])
        error: KafkaError | None = None
        for _ in range(40):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            assert error is not None, f"read offset {msg.offset()} below the log start"
            break
        assert error is not None, "no out-of-range error within 20s"
        assert error.code() == KafkaError._AUTO_OFFSET_RESET
        assert "out of range" in error.str().lower()

        # Reading from the new log start works and yields the 500th entry.
        consumer.assign([TopicPartition(topic, 0, 500)])
        first = None
        for _ in range(40):
            first = consumer.poll(0.5)
            if first is not None:
                break
        assert first is not None and first.error() is None
        assert (first.offset(), first.value()) == (500, b"entry-500")
    finally:
        consumer.close()


def test_etcd_compare_and_swap_succeeds_once_then_fails_on_stale_revision(
    etcd_endpoint: str, unique_prefix: str
) -> None:
    host, port = etcd_endpoint.rsplit(":", 1)
    client = pyetcd.client(host, int(port), timeout=10)
    key = f"/{unique_prefix}/cas"
    try:
        client.put(key, "v1")
        _, meta = client.get(key)
        seen = meta.mod_revision

        ok, _ = client.transaction(
            compare=[client.transactions.mod(key) == seen],
            success=[client.transactions.put(key, "v2")],
            failure=[],
        )
        assert ok is True
        ok, _ = client.transaction(
            compare=[client.transactions.mod(key) == seen],
            success=[client.transactions.put(key, "v3")],
            failure=[],
        )
        assert ok is False
        value, meta = client.get(key)
        assert value == b"v2"
        assert meta.mod_revision > seen
    finally:
        client.delete_prefix(f"/{unique_prefix}/")
        client.close()
