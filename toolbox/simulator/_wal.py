"""The datanode's Kafka side: one idempotent producer for writing WAL records, and replay.

Writing: `acks=all`, idempotence on, partition 0 of the region's topic, key = the region id
(decimal ASCII). A background thread serves delivery reports; a record counts as written
only when its report carries an offset.

Replay is the datanode client's (`metasrv.datanode.replay_entries`): the WAL archive's
objects metasrv names, then a consumer assigned to partition 0 at an explicit offset with
`auto.offset.reset=error`, so a start below Kafka's log start offset that the archive does
not hold (entries a region needed were deleted) raises `WalDataLoss` instead of silently
skipping ahead. `region_rows` keeps one region's rows of what it yields.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from metasrv import wire
from metasrv.datanode import WalEntry, replay_entries
from metasrv.errors import KafkaUnavailable
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


def replay_config(bootstrap: str) -> dict[str, Any]:
    """The replay consumer's Kafka settings: `bootstrap`, librdkafka's logs to
    `client_logger`."""
    return {"bootstrap.servers": bootstrap, "log_level": 3, "logger": client_logger}


def region_rows(entries: Iterable[WalEntry], region_id: int) -> tuple[list[WalRow], int]:
    """The rows of region `region_id` (records whose key is the region's) among `entries`,
    and the number of entries read (every region's)."""
    key = region_key(region_id)
    rows: list[WalRow] = []
    read = 0
    for entry in entries:
        read += 1
        if entry.key == key:
            value = entry.value or b""
            rows.append(WalRow(entry_id=entry.entry_id, seq=_seq_of(value), value=value))
    return rows, read


def read_region_entries(
    bootstrap: str,
    topic: str,
    region_id: int,
    start_entry_id: int,
    *,
    timeout: float = 60.0,
) -> tuple[list[WalRow], int]:
    """Replay partition 0 of `topic` from `start_entry_id` to the current high watermark,
    from Kafka alone (no archive).

    Returns the region's rows and the number of records read. Raises `WalDataLoss` when
    the start is below the log start offset (entries were deleted), and `KafkaUnavailable`
    on transport errors or when the end is not reached in `timeout`.
    """
    answer = wire.ReplayStart(region_id=region_id, topic=topic, start_entry_id=start_entry_id)
    entries = replay_entries(answer, kafka=replay_config(bootstrap), timeout=timeout)
    return region_rows(entries, region_id)


def _seq_of(value: bytes) -> int:
    return int(json.loads(value)["seq"])
