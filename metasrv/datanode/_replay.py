"""Replaying a region's WAL: the archive's objects first, then Kafka (DESIGN §8, "Restore").

`replay_region` asks metasrv where to replay from (`DatanodeClient.replay_answer`) and
`replay_entries` reads what the answer names:

1. from `start = replay_from(start_entry_id, flushed_entry_id)`;
2. when that is below Kafka's log start, the archive's objects the answer lists, in order,
   from the object store (`metasrv.archive.decode_object`), keeping the entries in
   [start, log start): objects may overlap, so an entry already yielded is skipped;
3. then partition 0 of the topic from where the archive stopped (or from `start`) up to
   the high watermark found when the Kafka read began.

Every entry of the topic comes out once, in entry order, as `WalEntry(entry_id, key,
value)`, whichever region wrote it: the caller keeps its own region's. Loss is never
skipped over: a start below the log start that the archive does not hold, an object whose
rows do not match its name, a consumer that finds its offset gone
(`auto.offset.reset=error`) or a hole in Kafka's offsets raise `WalDataLoss`; a store that
does not answer raises `ObjectStoreUnavailable`, Kafka `KafkaUnavailable` (ask again).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from metasrv import wire
from metasrv.datanode._client import DatanodeClient, replay_from
from metasrv.errors import ConfigError, KafkaUnavailable, NotFound, ObjectCorrupt, WalDataLoss
from metasrv.kafka import translate_kafka_error

if TYPE_CHECKING:
    # Loaded only by a replay that reads the archive: boto3 and pyarrow would otherwise
    # cost every program embedding the datanode client a quarter of a second.
    from metasrv.archive import ObjectStore

logger = logging.getLogger(__name__)

_KAFKA_RETRY_PAUSE = 0.5
"""Seconds between two reads of the high watermark while Kafka is away."""


class WalEntry(NamedTuple):
    """One WAL entry as a replay yields it."""

    entry_id: int
    """Its Kafka offset in partition 0 of the topic."""
    key: bytes | None
    value: bytes | None


KafkaConfig = str | Mapping[str, Any]
"""Kafka's bootstrap servers, or a librdkafka configuration (TLS, SASL, ...) that names
them; the replay adds its own consumer settings."""


def replay_region(
    client: DatanodeClient,
    region_id: int,
    *,
    kafka: KafkaConfig,
    store: ObjectStore | None = None,
    flushed_entry_id: int | None = None,
    timeout: float = 60.0,
) -> Iterator[WalEntry]:
    """Every WAL entry of region `region_id`'s topic from where it replays on: the archive's
    objects metasrv names, then Kafka (`replay_entries`). `store`: the WAL archive's bucket,
    needed only when the start is below Kafka's log start. `flushed_entry_id`: the region's
    own, from its manifest (`replay_from`)."""
    answer = client.replay_answer(region_id, timeout=min(timeout, 30.0))
    yield from replay_entries(
        answer, kafka=kafka, store=store, flushed_entry_id=flushed_entry_id, timeout=timeout
    )


def replay_entries(
    answer: wire.ReplayStart,
    *,
    kafka: KafkaConfig,
    store: ObjectStore | None = None,
    flushed_entry_id: int | None = None,
    timeout: float = 60.0,
) -> Iterator[WalEntry]:
    """The entries of `answer.topic` from `replay_from(answer.start_entry_id,
    flushed_entry_id)` to Kafka's high watermark, archived ones first (module docstring).
    `timeout`: seconds the Kafka read may take to reach the high watermark."""
    start = replay_from(answer.start_entry_id, flushed_entry_id)
    log_start = answer.log_start_offset
    next_id = start
    if log_start is not None and start < log_start:
        if answer.archive is None:
            raise WalDataLoss(
                f"region {answer.region_id}: replay of {answer.topic} from {start}: Kafka's log "
                f"start is {log_start} and the WAL archive does not hold the entries below it",
                details=_details(answer, start),
            )
        if store is None:
            raise ConfigError(
                f"region {answer.region_id}: replay of {answer.topic} from {start} needs the "
                f"WAL archive (Kafka's log start is {log_start}), but no object store is given"
            )
        for obj in answer.archive:
            if next_id >= log_start:
                break
            for entry in _archived(store, obj, answer):
                if entry.entry_id < next_id:
                    continue  # below the start, or yielded from the object before
                if entry.entry_id >= log_start:
                    break
                if entry.entry_id != next_id:
                    # Dense, as Kafka's offsets are (`_from_kafka`).
                    raise WalDataLoss(
                        f"region {answer.region_id}: archive object {obj.key} has no entry "
                        f"{next_id} (its next is {entry.entry_id})",
                        details={**_details(answer, start), "key": obj.key},
                    )
                yield entry
                next_id += 1
        if next_id < log_start:
            raise WalDataLoss(
                f"region {answer.region_id}: the WAL archive's objects of {answer.topic} end "
                f"at {next_id}, below Kafka's log start {log_start}",
                details=_details(answer, start),
            )
        logger.info(
            "replayed from the WAL archive",
            extra={
                "region_id": answer.region_id,
                "topic": answer.topic,
                "from": start,
                "to": log_start,
                "objects": len(answer.archive),
            },
        )
    yield from _from_kafka(answer, kafka, next_id, start, timeout)


def _details(answer: wire.ReplayStart, start: int) -> dict[str, Any]:
    return {
        "region_id": answer.region_id,
        "topic": answer.topic,
        "start_entry_id": start,
        "log_start_offset": answer.log_start_offset,
    }


def _archived(
    store: ObjectStore, obj: wire.ArchivedObject, answer: wire.ReplayStart
) -> list[WalEntry]:
    """The entries of one archived object, checked against the range its key names: rows
    in ascending entry order, the first and the last being the named ones."""
    if obj.bucket != store.bucket:
        raise ConfigError(
            f"metasrv names the archive object {obj.key} in bucket {obj.bucket}; this "
            f"datanode's object store is bucket {store.bucket}"
        )
    import pyarrow as pa

    from metasrv.archive import decode_object

    body = store.get(obj.key)  # its SHA-256 checked
    try:
        records = decode_object(body)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ObjectCorrupt(
            f"object store: {obj.key} is not a WAL archive object: {exc}",
            details={"key": obj.key},
        ) from exc
    ids = [r.entry_id for r in records]
    ascending = all(a < b for a, b in itertools.pairwise(ids))
    if not ids or not ascending or (ids[0], ids[-1]) != (obj.first_entry_id, obj.last_entry_id):
        span = f"{ids[0]}..{ids[-1]}" if ids else "no rows"
        raise WalDataLoss(
            f"region {answer.region_id}: archive object {obj.key} holds {span} "
            f"({'' if ascending else 'not '}ascending), its key names "
            f"{obj.first_entry_id}..{obj.last_entry_id}",
            details={**_details(answer, answer.start_entry_id), "key": obj.key},
        )
    return [WalEntry(r.entry_id, r.key, r.value) for r in records]


def _consumer_config(kafka: KafkaConfig) -> dict[str, Any]:
    base: dict[str, Any] = {"bootstrap.servers": kafka} if isinstance(kafka, str) else dict(kafka)
    return {
        **base,
        # An assigned partition, never a subscription: the group is only librdkafka's need.
        "group.id": f"metasrv-replay-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # The guard against reading past deleted entries: a start Kafka no longer holds is
        # an error, never a silent jump to the log start.
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
        "isolation.level": "read_uncommitted",
    }


def _from_kafka(
    answer: wire.ReplayStart, kafka: KafkaConfig, first: int, start: int, timeout: float
) -> Iterator[WalEntry]:
    """Partition 0 of the topic from `first` to the high watermark read first."""
    topic = answer.topic
    consumer = Consumer(_consumer_config(kafka))
    try:
        deadline = time.monotonic() + timeout
        high = _high_watermark(consumer, topic, deadline)
        if first > high:
            # Entries the region saw acknowledged are not in the topic (truncated, or
            # deleted and recreated): as lost as those below the log start.
            raise WalDataLoss(
                f"region {answer.region_id}: replay of {topic} from {first}: above its high "
                f"watermark {high}",
                details=_details(answer, start),
            )
        if first == high:
            return
        consumer.assign([TopicPartition(topic, 0, first)])
        next_offset = first
        while next_offset < high:
            if time.monotonic() > deadline:
                raise KafkaUnavailable(
                    f"region {answer.region_id}: replay of {topic} stopped at {next_offset} "
                    f"of {high} after {timeout:g}s"
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
                            f"region {answer.region_id}: replay of {topic} from {next_offset}: "
                            f"{err.str()}",
                            details={**_details(answer, start), "kafka_error": err.name()},
                        )
                    raise translate_kafka_error(KafkaException(err), f"replay of {topic}")
                offset = msg.offset()
                if offset is None or offset >= high:
                    break
                if offset != next_offset:
                    # Partition 0's offsets are dense (no transactions, no compaction on WAL
                    # topics): a hole below the end means entries vanished mid-replay.
                    raise WalDataLoss(
                        f"region {answer.region_id}: replay of {topic} expected entry "
                        f"{next_offset}, Kafka gave {offset}",
                        details=_details(answer, start),
                    )
                yield WalEntry(offset, msg.key(), msg.value())
                next_offset = offset + 1
    finally:
        consumer.close()


def _high_watermark(consumer: Consumer, topic: str, deadline: float) -> int:
    """Partition 0's high watermark; a Kafka away (a broker restarting, metadata not loaded
    yet) is asked again until `deadline`, as a region waits for its WAL to come back."""
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
            time.sleep(_KAFKA_RETRY_PAUSE)
