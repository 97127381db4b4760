"""`replay_entries` against real Kafka and the stack's S3-compatible server, from replay-start
answers built by hand: the archive's objects, then Kafka, and every way it refuses to skip."""

from __future__ import annotations

import pytest

from metasrv import wire
from metasrv.archive import ArchivedRange, ObjectStore, WalRecord, encode_object, parse_object_key
from metasrv.datanode import WalEntry, replay_entries
from metasrv.errors import ConfigError, WalDataLoss
from tests._archive import produce_records, put_archived, trim

LOG_START = 20


@pytest.fixture
def records(kafka_bootstrap: str, kafka_topic: str) -> list[WalRecord]:
    """30 records on the topic, Kafka keeping those from `LOG_START` on."""
    produced = produce_records(kafka_bootstrap, kafka_topic, 30)
    assert trim(kafka_bootstrap, kafka_topic, LOG_START) == LOG_START
    return produced


def _answer(topic: str, start: int, store: ObjectStore, keys: list[str] | None) -> wire.ReplayStart:
    objects = None
    if keys is not None:
        objects = []
        for key in keys:
            entries = parse_object_key(store.prefix, key)
            objects.append(
                wire.ArchivedObject(
                    bucket=store.bucket,
                    key=key,
                    first_entry_id=entries.first_entry_id,
                    last_entry_id=entries.last_entry_id,
                )
            )
    return wire.ReplayStart(
        region_id=1,
        topic=topic,
        start_entry_id=start,
        log_start_offset=LOG_START,
        archive=objects,
    )


def _entries(records: list[WalRecord]) -> list[WalEntry]:
    return [WalEntry(r.entry_id, r.key, r.value) for r in records]


def test_overlapping_objects_then_kafka_give_each_entry_once_from_the_region_start(
    kafka_bootstrap: str, kafka_topic: str, archive_store: ObjectStore, records: list[WalRecord]
) -> None:
    keys = [
        put_archived(archive_store, kafka_topic, records[0:12]),
        put_archived(archive_store, kafka_topic, records[8:20]),
    ]
    answer = _answer(kafka_topic, 3, archive_store, keys)
    replayed = list(replay_entries(answer, kafka=kafka_bootstrap, store=archive_store))
    assert replayed == _entries(records[3:])
    # The region's own flushed id, past the archive: Kafka alone, the objects unread.
    later = replay_entries(answer, kafka=kafka_bootstrap, store=None, flushed_entry_id=24)
    assert list(later) == _entries(records[25:])


def test_an_object_whose_rows_are_not_its_keys_range_is_data_loss(
    kafka_bootstrap: str, kafka_topic: str, archive_store: ObjectStore, records: list[WalRecord]
) -> None:
    # Named 0..19, holding 0..9 and 11..19: entry 10 is missing.
    key = ArchivedRange(kafka_topic, 0, 19).key(archive_store.prefix)
    archive_store.put(key, encode_object(records[0:10] + records[11:20]))
    answer = _answer(kafka_topic, 0, archive_store, [key])
    with pytest.raises(WalDataLoss, match="no entry 10"):
        list(replay_entries(answer, kafka=kafka_bootstrap, store=archive_store))
    # Named 0..19, ending at 18.
    archive_store.put(key, encode_object(records[0:19]))
    with pytest.raises(WalDataLoss, match=r"holds 0\.\.18"):
        list(replay_entries(answer, kafka=kafka_bootstrap, store=archive_store))


@pytest.fixture
def from_zero(
    kafka_topic: str, archive_store: ObjectStore, records: list[WalRecord]
) -> wire.ReplayStart:
    """The answer for a region replaying from 0: entries 0..19 archived as one object."""
    key = put_archived(archive_store, kafka_topic, records[0:LOG_START])
    return _answer(kafka_topic, 0, archive_store, [key])


def test_an_archive_without_a_store_is_a_config_error(
    kafka_bootstrap: str, from_zero: wire.ReplayStart
) -> None:
    with pytest.raises(ConfigError, match="no object store"):
        list(replay_entries(from_zero, kafka=kafka_bootstrap, store=None))


def test_kafka_trimmed_again_after_the_answer_fails_loudly(
    kafka_bootstrap: str,
    kafka_topic: str,
    archive_store: ObjectStore,
    records: list[WalRecord],
    from_zero: wire.ReplayStart,
) -> None:
    assert trim(kafka_bootstrap, kafka_topic, 25) == 25
    replay = replay_entries(from_zero, kafka=kafka_bootstrap, store=archive_store)
    assert [next(replay) for _ in range(LOG_START)] == _entries(records[:LOG_START])
    with pytest.raises(WalDataLoss, match="replay of"):
        next(replay)


def test_a_start_above_the_high_watermark_is_data_loss(
    kafka_bootstrap: str, kafka_topic: str, archive_store: ObjectStore, records: list[WalRecord]
) -> None:
    answer = wire.ReplayStart(region_id=1, topic=kafka_topic, start_entry_id=len(records) + 5)
    with pytest.raises(WalDataLoss, match="above its high watermark 30"):
        list(replay_entries(answer, kafka=kafka_bootstrap))
    at_the_end = wire.ReplayStart(region_id=1, topic=kafka_topic, start_entry_id=len(records))
    assert list(replay_entries(at_the_end, kafka=kafka_bootstrap)) == []
