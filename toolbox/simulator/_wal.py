"""The datanode's Kafka side: one idempotent producer for writing WAL records, and replay.

Writing: `acks=all`, idempotence on, partition 0 of the region's topic, key = the region id
(decimal ASCII). A background thread serves delivery reports; a record counts as written
only when its report carries an offset.

Replay: a consumer assigned to partition 0 at an explicit offset with
`auto.offset.reset=error`, so a start below Kafka's log start offset (entries a region
needed were deleted) raises `WalDataLoss` instead of silently skipping ahead.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer as _Consumer
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from metasrv.errors import KafkaUnavailable, NotFound, WalDataLoss
from metasrv.kafka import translate_kafka_error
from toolbox.simulator._storage import WalRow

logger = logging.getLogger(__name__)
# librdkafka's own log lines (connection refused, ...) go here rather than to stderr, so an
# embedding program (the demo) decides whether to show them.
client_logger = logging.getLogger("toolbox.simulator.librdkafka")

DeliveryCallback = Callable[[KafkaError | None, Message], None]
Tee = Callable[[str, bytes, bytes], None]
"""Called with (topic, key, value) after each record is queued."""


def entry_id_of(msg: Message) -> int:
    """The offset a delivered or consumed message has (always set for those)."""
    offset = msg.offset()
    if offset is None:
        raise KafkaUnavailable(f"message on {msg.topic()} has no offset")
    return offset


def region_key(region_id: int) -> bytes:
    """The record key of a region's WAL entries."""
    return str(region_id).encode()


@dataclass(frozen=True, slots=True)
class TopicCounters:
    """What one producer wrote to one topic (cumulative since it started)."""

    record_size: int
    """Bytes (key + value) of acknowledged records."""
    record_num: int
    """Acknowledged records."""
    latest_entry_id: int
    """Highest offset a delivery report gave (-1: none yet)."""


class WalWriter:
    """One idempotent producer plus the thread that serves its delivery reports."""

    def __init__(
        self,
        bootstrap: str,
        *,
        client_id: str = "metasrv-sim",
        message_timeout: float = 30.0,
        tee: Tee | None = None,
    ) -> None:
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": client_id,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": int(message_timeout * 1000),
                "reconnect.backoff.max.ms": 2000,
                "log_level": 3,
                "logger": client_logger,
            }
        )
        self._tee = tee
        self._lock = threading.Lock()
        self._counters: dict[str, list[int]] = {}
        self._alive = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"{client_id}-poll", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self._producer.poll(0.05)
            except Exception:
                # A callback that raises is re-raised by poll(). Were this thread to die,
                # every later delivery report would go unserved: writes in flight forever,
                # regions that never go idle nor flush, and purges pinned behind them.
                logger.exception("WAL writer: a delivery callback failed; serving on")

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery: DeliveryCallback) -> None:
        """Queue one record for partition 0 of `topic`; `on_delivery` runs on the poll thread."""

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if not self._alive:
                return  # the writer was aborted (simulated crash): nobody hears this report
            if err is None and msg.offset() is None:
                # An idempotent retry the broker answered DUPLICATE_SEQUENCE_NUMBER (a
                # broker restart between the write and its answer): librdkafka reports it
                # delivered, without an offset. An acknowledgement names its entry id, so
                # this is a failed write like any possibly persisted one; replay reads the
                # record back from the WAL like any other.
                err = KafkaError(KafkaError._FAIL, f"{topic}: persisted, but its offset is unknown")
            if err is None:
                with self._lock:
                    c = self._counters.setdefault(topic, [0, 0, -1])
                    c[0] += len(key) + len(value)
                    c[1] += 1
                    c[2] = max(c[2], entry_id_of(msg))
            on_delivery(err, msg)

        deadline = time.monotonic() + 30.0
        while True:
            if not self._alive:
                raise KafkaUnavailable("WAL writer is closed")
            try:
                self._producer.produce(topic, value, key, partition=0, on_delivery=delivered)
                break
            except BufferError:
                # Local queue full: wait for deliveries to drain it (backpressure).
                if time.monotonic() > deadline:
                    raise KafkaUnavailable(f"produce to {topic}: local queue full") from None
                time.sleep(0.01)
            except KafkaException as exc:
                raise translate_kafka_error(exc, f"produce to {topic}") from exc
        if self._tee is not None:
            self._tee(topic, key, value)

    def counters(self) -> dict[str, TopicCounters]:
        """Per-topic cumulative counters of acknowledged records."""
        with self._lock:
            return {t: TopicCounters(c[0], c[1], c[2]) for t, c in self._counters.items()}

    def close(self, timeout: float = 30.0) -> int:
        """Deliver what is queued, then stop. Returns the number of records left undelivered."""
        left = int(self._producer.flush(timeout))
        self._stop.set()
        self._thread.join()
        self._alive = False
        return left

    def abort(self) -> None:
        """Crash: stop serving reports at once and drop queued records (no acknowledgements)."""
        self._alive = False
        self._stop.set()
        self._thread.join()
        self._producer.purge(in_queue=True, in_flight=False, blocking=False)


def read_region_entries(
    bootstrap: str,
    topic: str,
    region_id: int,
    start_entry_id: int,
    *,
    timeout: float = 60.0,
) -> tuple[list[WalRow], int]:
    """Replay partition 0 of `topic` from `start_entry_id` to the current high watermark.

    Returns the region's rows (records whose key is the region's) and the number of
    records read. Raises `WalDataLoss` when the start is outside the log (below the log
    start offset: entries were deleted; above the high watermark: a bad start), and
    `KafkaUnavailable` on transport errors or when the end is not reached in `timeout`.
    """
    consumer = _Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"metasrv-sim-replay-{region_id}-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "isolation.level": "read_uncommitted",
            "log_level": 3,
            "logger": client_logger,
        }
    )
    key = region_key(region_id)
    rows: list[WalRow] = []
    read = 0
    try:
        deadline = time.monotonic() + timeout
        high = _high_watermark(consumer, topic, deadline)
        # No check against `low` here on purpose: the consumer's auto.offset.reset=error is
        # the guard a real datanode has, and the one tested.
        if start_entry_id == high:
            return rows, 0
        consumer.assign([TopicPartition(topic, 0, start_entry_id)])
        next_offset = start_entry_id
        while next_offset < high:
            if time.monotonic() > deadline:
                raise KafkaUnavailable(
                    f"region {region_id}: replay of {topic} stopped at {next_offset} of {high}"
                )
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    if err.code() in (
                        KafkaError._AUTO_OFFSET_RESET,
                        KafkaError.OFFSET_OUT_OF_RANGE,
                    ):
                        raise WalDataLoss(
                            f"region {region_id}: replay of {topic} from {start_entry_id}: "
                            f"{err.str()}",
                            details={
                                "region_id": region_id,
                                "topic": topic,
                                "start_entry_id": start_entry_id,
                                "kafka_error": err.name(),
                            },
                        )
                    raise translate_kafka_error(KafkaException(err), f"replay of {topic}")
                offset = entry_id_of(msg)
                if offset >= high:
                    break
                if offset != next_offset:
                    # Partition 0 offsets are dense for a non-transactional, non-compacted
                    # topic; a hole below the end means records vanished mid-replay.
                    raise WalDataLoss(
                        f"region {region_id}: replay of {topic} expected offset {next_offset}, "
                        f"got {offset}",
                        details={"region_id": region_id, "topic": topic},
                    )
                next_offset = offset + 1
                read += 1
                if msg.key() == key:
                    value = msg.value() or b""
                    rows.append(WalRow(entry_id=offset, seq=_seq_of(value), value=value))
        return rows, read
    finally:
        consumer.close()


def _high_watermark(consumer: _Consumer, topic: str, deadline: float) -> int:
    """Partition 0's high watermark; transient errors (a broker restarting, metadata not yet
    loaded) are retried until `deadline`, as a datanode waits for its WAL to come back."""
    while True:
        try:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, 0), timeout=5.0, cached=False
            )
            return int(high)
        except KafkaException as exc:
            error = translate_kafka_error(exc, f"watermarks of {topic}")
            if not isinstance(error, KafkaUnavailable | NotFound) or time.monotonic() > deadline:
                raise error from exc
            logger.warning("replay of %s waits for Kafka: %s", topic, error.message)
            time.sleep(0.5)


def _seq_of(value: bytes) -> int:
    return int(json.loads(value)["seq"])
