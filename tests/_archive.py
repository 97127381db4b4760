"""WAL archive fixtures for tests: objects written the way DESIGN §8 fixes them, Kafka records
produced with their offsets, a topic trimmed out of band, and a consumer group's committed
offset.

`put_archived` writes one object with `ObjectStore` directly, encoded as the archiver
encodes it (`metasrv.archive.encode_object`), so a test needs no archiver process; `trim` is
an operator's or another tool's DeleteRecords, and `commit_offset` a reader of the WAL (CDC, a
standby, the archiver) committing what it read, both through confluent-kafka's own clients
rather than metasrv's adapter. The `archive_store` fixture (tests/conftest.py) is
`open_store` on the test's own bucket prefix.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from metasrv.archive import ArchivedRange, ObjectStore, WalRecord, encode_object
from metasrv.settings import ArchiveSettings
from tests._wait import wait_until
from toolbox.stack import S3Endpoint


def archive_config(s3: S3Endpoint, prefix: str, **changes: object) -> dict[str, object]:
    """`[wal.archive]` enabled on the test's S3 server, under `prefix`, as a TOML table."""
    values: dict[str, object] = {
        "enabled": True,
        "endpoint": s3.endpoint,
        "bucket": s3.bucket,
        "prefix": prefix,
        "access_key_id": s3.access_key_id,
        "secret_access_key": s3.secret_access_key,
    }
    values.update(changes)
    return values


def archive_settings(s3: S3Endpoint, prefix: str, **changes: object) -> ArchiveSettings:
    """`archive_config` validated."""
    return ArchiveSettings.model_validate(archive_config(s3, prefix, **changes))


@contextlib.contextmanager
def open_store(s3: S3Endpoint, prefix: str, **changes: object) -> Iterator[ObjectStore]:
    """A client of the bucket under `prefix` (`archive_settings`); on exit every object under
    `prefix` is deleted (the stack's bucket is shared) and the client closed."""
    client = ObjectStore(archive_settings(s3, prefix, **changes))
    try:
        yield client
    finally:
        for obj in client.list(prefix):
            client.delete(obj.key)
        client.close()


def put_archived(store: ObjectStore, topic: str, records: Sequence[WalRecord]) -> str:
    """Archive `records` (consecutive entries of `topic`) as one object; returns its key."""
    key = ArchivedRange(topic, records[0].entry_id, records[-1].entry_id).key(store.prefix)
    store.put(key, encode_object(records))
    return key


def produce_records(bootstrap: str, topic: str, count: int, *, tag: str = "r") -> list[WalRecord]:
    """`count` records on partition 0 of `topic` (keys alternating between two regions), each
    acknowledged with its offset."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    acked: list[WalRecord] = []
    failed: list[str] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        offset = msg.offset()
        if err is not None or offset is None:
            failed.append(str(err))
            return
        acked.append(WalRecord(offset, msg.timestamp()[1], msg.key(), msg.value()))

    for i in range(count):
        key = str(1 + i % 2).encode()
        producer.produce(topic, f"{tag}-{i}".encode(), key, partition=0, on_delivery=delivered)
    assert producer.flush(30) == 0, "records left undelivered"
    assert not failed, failed
    return sorted(acked, key=lambda r: r.entry_id)


def trim(bootstrap: str, topic: str, offset: int) -> int:
    """DeleteRecords(topic, partition 0, offset) out of band; returns the new log start."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, 0, offset)], operation_timeout=10)
    [(_, future)] = futures.items()
    deleted = future.result(timeout=30)
    return int(deleted.low_watermark)


def commit_offset(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """A member of `group` commits `offset` on partition 0 of `topic` (synchronously), as a
    reader of the WAL does once it has what it read."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def archive_from_kafka(bootstrap: str, store: ObjectStore, topic: str, start: int, end: int) -> str:
    """Archive entries [start, end) of `topic` as Kafka holds them now, as one object (what
    an archiver would have written before a trim); returns its key."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-archive-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    records: list[WalRecord] = []

    def read_to_end() -> bool:
        for msg in consumer.consume(num_messages=500, timeout=0.2):
            assert msg.error() is None, msg.error()
            offset = msg.offset()
            assert offset is not None
            if offset < end:
                records.append(WalRecord(offset, msg.timestamp()[1], msg.key(), msg.value()))
        return len(records) >= end - start

    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        wait_until(read_to_end, f"entries {start}..{end - 1} of {topic}")
    finally:
        consumer.close()
    assert [r.entry_id for r in records] == list(range(start, end))
    return put_archived(store, topic, records)
