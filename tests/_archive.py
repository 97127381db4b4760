"""WAL archive fixtures for tests: objects written the way DESIGN §8 fixes them, Kafka records
produced with their offsets, and a topic trimmed out of band.

`put_archived` writes one object with `ObjectStore` directly (the archiver process is not
needed to have an archive); `trim` is an operator's or another tool's DeleteRecords, through
confluent-kafka's own AdminClient rather than metasrv's adapter.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from metasrv.archive import ArchivedRange, ObjectStore
from metasrv.settings import ArchiveSettings
from toolbox.stack import S3Endpoint

ARCHIVE_SCHEMA = pa.schema(
    [
        ("entry_id", pa.int64()),
        ("timestamp_ms", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        (
            "headers",
            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
        ),
    ]
)
"""DESIGN §8's columns of an archived object."""


@dataclass(frozen=True)
class Record:
    """One WAL record as Kafka acknowledged it."""

    entry_id: int
    key: bytes
    value: bytes
    timestamp_ms: int = 0


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


def parquet_of(records: Sequence[Record]) -> bytes:
    """The Parquet body of an archived object holding `records`."""
    table = pa.table(
        {
            "entry_id": [r.entry_id for r in records],
            "timestamp_ms": [r.timestamp_ms for r in records],
            "key": [r.key for r in records],
            "value": [r.value for r in records],
            "headers": [[] for _ in records],
        },
        schema=ARCHIVE_SCHEMA,
    )
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def put_archived(store: ObjectStore, topic: str, records: Sequence[Record]) -> str:
    """Archive `records` (consecutive entries of `topic`) as one object; returns its key."""
    key = ArchivedRange(topic, records[0].entry_id, records[-1].entry_id).key(store.prefix)
    store.put(key, parquet_of(records))
    return key


def produce_records(bootstrap: str, topic: str, count: int, *, tag: str = "r") -> list[Record]:
    """`count` records on partition 0 of `topic` (keys alternating between two regions), each
    acknowledged with its offset."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    acked: list[Record] = []
    failed: list[str] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        offset = msg.offset()
        if err is not None or offset is None:
            failed.append(str(err))
            return
        acked.append(Record(offset, msg.key() or b"", msg.value() or b"", msg.timestamp()[1]))

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
