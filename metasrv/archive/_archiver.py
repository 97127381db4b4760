"""The archiver (DESIGN §8): copies partition 0 of every WAL topic into immutable Parquet objects.

One `Archiver` is one member of the Kafka consumer group `[wal.archive] consumer_group`,
subscribed to the WAL pool (`{topic_name_prefix}_{n}`, n < num_topics). Kafka's group protocol
alone shares the topics between archivers; they never talk to each other.

Per assigned topic it buffers the records it reads. When a buffer holds `object_max_bytes`, or
its oldest record arrived `object_max_delay` ago, it writes one object
`{prefix}{topic}/{first:020d}-{last:020d}.parquet`, reads it back and verifies it (checksum, row
count, first and last entry ids, every value equal to what was written), and only then commits
`last + 1` for the group, synchronously. The invariant this keeps: **the group's committed
offset is never past an entry the bucket does not hold in a verified object.** Whatever fails
before the commit (a put, a get, a verification, the commit itself, a kill, a rebalance) leaves
the range uncommitted, so whoever reads the partition next archives it again: an overlap, never
a gap.

- A rebalance that revokes (or loses) a topic drops its uncommitted buffer; its next owner
  starts from the committed offset.
- The store down: the buffer waits (no commit), the write is retried with a growing delay,
  and a partition whose buffer is full is paused meanwhile; the archiver stays in the group.
- `stop` set (SIGTERM): an object being written is finished (verified, then committed) or
  abandoned; nothing new starts; the consumer leaves the group.

Entry ids are Kafka offsets. A record at an offset below the next one expected is a re-read
(after a pause) and is skipped; a hole in the offsets (entries Kafka no longer holds, or
transaction markers) is carried over, since an object names the offsets it holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from metasrv.archive._objects import ArchivedRange
from metasrv.archive._store import ObjectStore
from metasrv.errors import MetasrvError
from metasrv.settings import WalSettings

logger = logging.getLogger(__name__)

OBJECT_SCHEMA = pa.schema(
    [
        pa.field("entry_id", pa.int64(), nullable=False),
        pa.field("timestamp_ms", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field(
            "headers",
            # "element": the list's item name Parquet's spec uses (and pyarrow writes).
            pa.list_(
                pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
            ),
        ),
    ]
)
"""An archived object's columns (DESIGN §8). `key`/`value` are null for a record without one;
`timestamp_ms` is -1 when Kafka has no timestamp for the record."""

SESSION_TIMEOUT_MS = 10_000
"""How long the group waits for a killed archiver before its topics go to the others
(librdkafka's default, 45 s, would leave a topic unarchived that long)."""

_FIRST_RETRY, _MAX_RETRY = 0.5, 10.0
"""Seconds before a failed object is written again: doubling from the first to the most."""
_LAG_INTERVAL = 1.0
"""Seconds between two updates of the lag gauges."""
_MAX_POLL_WAIT = 0.5
"""Most seconds one poll of Kafka blocks, so `stop` is seen that soon."""


@dataclass(frozen=True)
class WalRecord:
    """One Kafka record of a WAL topic's partition 0, as an archived object holds it."""

    entry_id: int
    """The record's Kafka offset."""
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()

    @property
    def size(self) -> int:
        """Bytes it adds to a buffer (keys, values and headers; what `object_max_bytes` counts)."""
        heads = sum(len(k) + len(v or b"") for k, v in self.headers)
        return len(self.key or b"") + len(self.value or b"") + heads


def encode_object(records: Sequence[WalRecord]) -> bytes:
    """The Parquet object holding `records` (in order), with `OBJECT_SCHEMA`."""
    table = _table(records)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def decode_object(body: bytes) -> list[WalRecord]:
    """The records of an archived object (`encode_object`'s inverse)."""
    table = pq.read_table(io.BytesIO(body))
    if not table.schema.equals(OBJECT_SCHEMA):
        raise ValueError(f"not an archived WAL object: schema {table.schema}")
    return [
        WalRecord(
            row["entry_id"],
            row["timestamp_ms"],
            row["key"],
            row["value"],
            tuple((h["key"], h["value"]) for h in row["headers"] or ()),
        )
        for row in table.to_pylist()
    ]


def _table(records: Sequence[WalRecord]) -> pa.Table:
    return pa.Table.from_pydict(
        {
            "entry_id": [r.entry_id for r in records],
            "timestamp_ms": [r.timestamp_ms for r in records],
            "key": [r.key for r in records],
            "value": [r.value for r in records],
            "headers": [[{"key": k, "value": v} for k, v in r.headers] for r in records],
        },
        schema=OBJECT_SCHEMA,
    )


def verify_object(
    wanted: ArchivedRange, records: Sequence[WalRecord], body: bytes, read_back: bytes
) -> str | None:
    """Why the object read back (`read_back`) is not the one written (`body` from `records`,
    named `wanted`), or None when it is. Pure: the archiver's one decision before a commit."""
    if hashlib.sha256(read_back).digest() != hashlib.sha256(body).digest():
        return "its SHA-256 differs from the bytes written"
    try:
        rows = decode_object(read_back)
    except (ValueError, pa.ArrowException) as exc:
        return f"it does not decode: {exc}"
    if len(rows) != len(records):
        return f"it holds {len(rows)} rows, {len(records)} were written"
    if not rows or rows[0].entry_id != wanted.first_entry_id:
        return f"its first entry id is not {wanted.first_entry_id}"
    if rows[-1].entry_id != wanted.last_entry_id:
        return f"its last entry id {rows[-1].entry_id} is not {wanted.last_entry_id}"
    for row, record in zip(rows, records, strict=True):
        if row != record:
            return f"entry {record.entry_id} differs from the record written"
    return None


def _headers(message: Message) -> tuple[tuple[str, bytes | None], ...]:
    given = message.headers() or ()
    # A consumed record's headers come as a list of pairs (a dict only on the producer side).
    pairs = given.items() if isinstance(given, dict) else given
    return tuple((k, v.encode() if isinstance(v, str) else v) for k, v in pairs)


def pool_topics(wal: WalSettings) -> list[str]:
    """The WAL topic pool the archivers subscribe to: `{topic_name_prefix}_{n}`, n < num_topics."""
    return [f"{wal.topic_name_prefix}_{n}" for n in range(wal.num_topics)]


class PausePoint(StrEnum):
    """Where a test may stop an archiver (`Archiver(pause_at=...)`) to kill it there."""

    AFTER_PUT = "after_put"
    """The object is stored, not yet read back."""
    AFTER_VERIFY = "after_verify"
    """The object is verified, its range not yet committed."""


class ArchiverMetrics:
    """The archiver's Prometheus series, in their own registry."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.lag = Gauge(
            "metasrv_archiver_lag_entries",
            "Entries of the topic not yet archived and committed (high watermark - committed "
            "offset), for the topics this archiver is assigned",
            ["topic"],
            registry=r,
        )
        self.assigned = Gauge(
            "metasrv_archiver_assigned",
            "1 for each WAL topic this archiver is assigned",
            ["topic"],
            registry=r,
        )
        self.buffered = Gauge(
            "metasrv_archiver_buffered_entries",
            "Entries read and held in memory, not yet in a committed object, per topic",
            ["topic"],
            registry=r,
        )
        self.committed = Gauge(
            "metasrv_archiver_committed_offset",
            "The group's committed offset this archiver last committed or read, per topic",
            ["topic"],
            registry=r,
        )
        self.bytes_written = Counter(
            "metasrv_archiver_written_bytes", "Bytes of verified objects", ["topic"], registry=r
        )
        self.objects_written = Counter(
            "metasrv_archiver_written_objects", "Verified objects", ["topic"], registry=r
        )
        self.verify_failures = Counter(
            "metasrv_archiver_verify_failures",
            "Objects that did not read back as written (none committed)",
            ["topic"],
            registry=r,
        )
        self.store_errors = Counter(
            "metasrv_archiver_store_errors",
            "Failed object store calls, by operation",
            ["operation"],
            registry=r,
        )
        self.commit_errors = Counter(
            "metasrv_archiver_commit_errors", "Failed offset commits", ["topic"], registry=r
        )

    def render(self) -> bytes:
        """The Prometheus text exposition of every series."""
        return generate_latest(self.registry)


@dataclass
class _Buffer:
    """One topic's records read and not yet committed, oldest first, with arrival times."""

    records: deque[tuple[WalRecord, float]] = field(default_factory=deque)
    size: int = 0
    next_offset: int = -1
    """The offset after the last record taken; -1 until one is."""

    def due(self, now: float, max_bytes: int, max_delay: float) -> bool:
        if not self.records:
            return False
        return self.size >= max_bytes or now - self.records[0][1] >= max_delay

    def head(self, max_bytes: int) -> list[WalRecord]:
        """The records of the next object: the oldest ones up to `max_bytes` (at least one)."""
        taken: list[WalRecord] = []
        size = 0
        for record, _ in self.records:
            if taken and size + record.size > max_bytes:
                break
            taken.append(record)
            size += record.size
        return taken

    def drop(self, count: int) -> None:
        for _ in range(count):
            record, _ = self.records.popleft()
            self.size -= record.size


class _StoreFailed(Exception):
    """A write or read-back failed, or the object did not verify; the range stays uncommitted."""


class Archiver:
    """One member of the archive's consumer group (see the module docstring). Build it, then
    call `run(stop)` in one thread; `ready` and `metrics` may be read from any other."""

    def __init__(
        self,
        wal: WalSettings,
        store: ObjectStore,
        *,
        client_config: Mapping[str, Any] | None = None,
        metrics: ArchiverMetrics | None = None,
        pause_at: PausePoint | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`client_config`: librdkafka properties for `[wal.tls]` / `[wal.sasl]`
        (`metasrv.kafka.client_config`); `pause_at`: tests only, see `PausePoint`."""
        self.settings = wal.archive
        self.topics = pool_topics(wal)
        self.store = store
        self.metrics = metrics or ArchiverMetrics()
        self._pause_at = pause_at
        self._clock = clock
        self._conf: dict[str, Any] = {
            **(client_config or {}),
            "bootstrap.servers": ",".join(wal.broker_endpoints),
            "group.id": self.settings.consumer_group,
            "client.id": "metasrv-archiver",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            # Incremental: a member joining or leaving moves only the topics that change
            # hands, so the others keep their buffers.
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            # Pool topics created after the start are picked up within this.
            "topic.metadata.refresh.interval.ms": 10_000,
            "log_level": 3,
        }
        self._buffers: dict[str, _Buffer] = {}
        self._committed: dict[str, int] = {}
        self._paused: set[str] = set()
        self._missing_logged: set[str] = set()
        self._assigned_once = False
        self._store_ok = True
        self._retry_at = 0.0
        self._retry_delay = _FIRST_RETRY
        self._lag_at = float("-inf")
        self._lock = threading.Lock()

    # -- what others may read ----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """The group has given this archiver its assignment and the store's last call answered."""
        with self._lock:
            return self._assigned_once and self._store_ok

    @property
    def assigned(self) -> list[str]:
        """The WAL topics this archiver holds now."""
        with self._lock:
            return sorted(self._buffers)

    def _mark_store(self, ok: bool) -> None:
        with self._lock:
            self._store_ok = ok

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Archive until `stop` is set, then leave the group. Uncommitted buffers are abandoned."""
        consumer = Consumer(self._conf)
        consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        logger.info(
            "archiver joined its group",
            extra={"group": self.settings.consumer_group, "topics": len(self.topics)},
        )
        try:
            while not stop.is_set():
                for message in consumer.consume(1000, self._poll_wait()):
                    self._take(message)
                self._flush_due(consumer, stop)
                self._update_lag(consumer)
        finally:
            with self._lock:
                abandoned = sum(len(b.records) for b in self._buffers.values())
                self._buffers.clear()
            logger.info("archiver leaving its group", extra={"abandoned_records": abandoned})
            consumer.close()

    def _poll_wait(self) -> float:
        now = self._clock()
        if now < self._retry_at:
            # Backing off: due buffers wait for the retry, so do not spin on them.
            return min(_MAX_POLL_WAIT, self._retry_at - now)
        wait = _MAX_POLL_WAIT
        delay = self.settings.object_max_delay
        for buffer in self._buffers.values():
            if buffer.records:
                wait = min(wait, buffer.records[0][1] + delay - now)
        return max(0.0, wait)

    def _take(self, message: Message) -> None:
        error = message.error()
        topic = message.topic() or ""
        if error is not None:
            if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                if topic not in self._missing_logged:
                    self._missing_logged.add(topic)
                    logger.warning("WAL topic does not exist (yet)", extra={"topic": topic})
            elif error.code() != KafkaError._PARTITION_EOF:
                logger.warning("kafka: %s", error.str(), extra={"topic": topic})
            return
        buffer = self._buffers.get(topic)
        offset = message.offset()
        # Entries live in partition 0 only (DESIGN §1); other partitions of a pool topic
        # are empty, and a record from before a pause or revoke is already buffered or gone.
        if message.partition() != 0 or buffer is None or offset is None:
            return
        if offset < buffer.next_offset:
            return
        _, ts = message.timestamp()
        record = WalRecord(offset, ts, message.key(), message.value(), _headers(message))
        buffer.records.append((record, self._clock()))
        buffer.size += record.size
        buffer.next_offset = offset + 1

    def _flush_due(self, consumer: Consumer, stop: threading.Event) -> None:
        now = self._clock()
        if now < self._retry_at:
            return
        max_bytes, max_delay = self.settings.object_max_bytes, self.settings.object_max_delay
        for topic in list(self._buffers):
            while not stop.is_set():
                buffer = self._buffers.get(topic)
                if buffer is None or not buffer.due(self._clock(), max_bytes, max_delay):
                    break
                records = buffer.head(max_bytes)
                try:
                    self._archive(consumer, topic, records, stop)
                except _StoreFailed:
                    self._back_off(consumer)
                    return
                except KafkaException as exc:
                    # Most often a rebalance under way: the next poll revokes the topic
                    # (dropping the buffer) or keeps it, and the object is written again.
                    self.metrics.commit_errors.labels(topic).inc()
                    logger.warning(
                        "commit failed; the range stays uncommitted",
                        extra={"topic": topic, "error": str(exc)},
                    )
                    self._back_off(consumer)
                    return
                # A revoke during the commit may have dropped the buffer already.
                if self._buffers.get(topic) is buffer:
                    buffer.drop(len(records))
        self._retry_delay = _FIRST_RETRY
        if self._paused:
            consumer.resume([TopicPartition(t, 0) for t in sorted(self._paused)])
            self._paused.clear()

    def _back_off(self, consumer: Consumer) -> None:
        """Wait before writing again; pause the topics whose buffers are full meanwhile."""
        self._retry_at = self._clock() + self._retry_delay
        self._retry_delay = min(_MAX_RETRY, self._retry_delay * 2)
        full = {
            t
            for t, b in self._buffers.items()
            if b.size >= self.settings.object_max_bytes and t not in self._paused
        }
        if full:
            consumer.pause([TopicPartition(t, 0) for t in sorted(full)])
            self._paused |= full

    def _archive(
        self, consumer: Consumer, topic: str, records: list[WalRecord], stop: threading.Event
    ) -> None:
        """Write, read back, verify, then commit one object; `_StoreFailed` before the commit."""
        wanted = ArchivedRange(topic, records[0].entry_id, records[-1].entry_id)
        key = wanted.key(self.settings.prefix)
        body = encode_object(records)
        log = {"topic": topic, "key": key, "entries": len(records), "bytes": len(body)}
        self._store_call("put", lambda: self.store.put(key, body), log)
        self._reached(PausePoint.AFTER_PUT, stop, log)
        read_back = self._store_call("get", lambda: self.store.get(key), log)
        problem = verify_object(wanted, records, body, read_back)
        if problem is not None:
            self.metrics.verify_failures.labels(topic).inc()
            logger.error("archived object did not verify: %s", problem, extra=log)
            raise _StoreFailed(problem)
        self._reached(PausePoint.AFTER_VERIFY, stop, log)
        consumer.commit(offsets=[TopicPartition(topic, 0, wanted.end)], asynchronous=False)
        self._committed[topic] = wanted.end
        self.metrics.committed.labels(topic).set(wanted.end)
        self.metrics.objects_written.labels(topic).inc()
        self.metrics.bytes_written.labels(topic).inc(len(body))
        logger.info("archived", extra={**log, "committed": wanted.end})

    def _store_call(self, operation: str, call: Callable[[], Any], log: Mapping[str, Any]) -> Any:
        try:
            answer = call()
        except MetasrvError as exc:
            self.metrics.store_errors.labels(operation).inc()
            self._mark_store(False)
            logger.warning(
                "object store %s failed; the range stays uncommitted",
                operation,
                extra={**log, "error": str(exc), "retryable": exc.retryable},
            )
            raise _StoreFailed(str(exc)) from exc
        self._mark_store(True)
        return answer

    def _reached(self, point: PausePoint, stop: threading.Event, log: Mapping[str, Any]) -> None:
        if self._pause_at is point:
            logger.warning("paused (test hook)", extra={**log, "point": point.value})
            stop.wait()

    # -- the group's callbacks (run inside consume) --------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        mine = sorted({p.topic for p in partitions if p.partition == 0})
        committed = self._read_committed(consumer, mine)
        with self._lock:
            for topic in mine:
                self._buffers[topic] = _Buffer()
            self._assigned_once = True
        for topic in mine:
            self.metrics.assigned.labels(topic).set(1)
            if topic in committed:
                self._committed[topic] = committed[topic]
                self.metrics.committed.labels(topic).set(committed[topic])
        self._lag_at = float("-inf")
        logger.info("topics assigned", extra={"topics": mine, "committed": committed})

    def _read_committed(self, consumer: Consumer, topics: Iterable[str]) -> dict[str, int]:
        wanted = [TopicPartition(t, 0) for t in topics]
        if not wanted:
            return {}
        try:
            answer = consumer.committed(wanted, timeout=10)
        except KafkaException as exc:
            logger.warning("committed offsets not read", extra={"error": str(exc)})
            return {}
        return {tp.topic: tp.offset for tp in answer if tp.error is None and tp.offset >= 0}

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget(partitions, "revoked")

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget(partitions, "lost")

    def _forget(self, partitions: list[TopicPartition], how: str) -> None:
        m = self.metrics
        topics = sorted({p.topic for p in partitions if p.partition == 0})
        dropped = 0
        with self._lock:
            for topic in topics:
                buffer = self._buffers.pop(topic, None)
                dropped += len(buffer.records) if buffer else 0
        for topic in topics:
            self._paused.discard(topic)
            self._committed.pop(topic, None)
            for gauge in (m.assigned, m.lag, m.committed, m.buffered):
                with contextlib.suppress(KeyError):  # no sample yet
                    gauge.remove(topic)
        logger.info(
            "topics %s; their uncommitted records are dropped",
            how,
            extra={"topics": topics, "dropped_records": dropped},
        )

    def _update_lag(self, consumer: Consumer) -> None:
        """The lag and buffered gauges, at most once a `_LAG_INTERVAL`."""
        now = self._clock()
        if now - self._lag_at < _LAG_INTERVAL:
            return
        self._lag_at = now
        for topic, buffer in list(self._buffers.items()):
            self.metrics.buffered.labels(topic).set(len(buffer.records))
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), cached=True)
            except KafkaException:
                continue
            if high < 0:
                continue
            base = self._committed.get(topic, max(low, 0))
            self.metrics.lag.labels(topic).set(max(0, high - base))
