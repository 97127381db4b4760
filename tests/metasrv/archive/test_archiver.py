"""The archiver in this process, against the real Kafka and the real S3-compatible server:
records come out as objects that cover them with no gap and read back equal, and the group's
committed offset moves to `last + 1` only once the object has verified."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metasrv.archive import (
    OBJECT_SCHEMA,
    ArchivedRange,
    Archiver,
    ObjectStore,
    PausePoint,
    WalRecord,
    decode_object,
    encode_object,
    pool_topics,
    verify_object,
)
from metasrv.kafka import KafkaAdmin
from metasrv.settings import WalSettings
from tests._wait import wait_until
from tests.metasrv.archive._wal import Pool, archived_entries, committed, produce, ranges
from toolbox.stack import StackConfig, s3_endpoint_of, start_service, stop_service

RECORDS = [
    WalRecord(7, 1_700_000_000_000, None, b"v7"),
    WalRecord(8, 1_700_000_000_001, b"k", None, (("h", b"x"), ("empty", None))),
    WalRecord(9, -1, b"k", b""),
]


# -- the object and its verification (no services) ------------------------------------------------


def test_an_object_has_the_design_columns_and_reads_back_equal() -> None:
    body = encode_object(RECORDS)
    schema = pq.read_schema(pa.BufferReader(body))
    assert [(f.name, str(f.type)) for f in schema] == [
        ("entry_id", "int64"),
        ("timestamp_ms", "int64"),
        ("key", "binary"),
        ("value", "binary"),
        ("headers", "list<element: struct<key: string, value: binary>>"),
    ]
    assert schema.equals(OBJECT_SCHEMA)
    assert decode_object(body) == RECORDS


def test_verify_names_every_way_an_object_can_differ() -> None:
    wanted = ArchivedRange("wal_0", 7, 9)
    body = encode_object(RECORDS)
    assert verify_object(wanted, RECORDS, body, body) is None
    changed = [*RECORDS[:2], replace(RECORDS[2], value=b"other")]
    assert "SHA-256" in str(verify_object(wanted, RECORDS, body, encode_object(changed)))
    # The same bytes, claimed for records they do not hold: each check speaks.
    assert "differs" in str(verify_object(wanted, changed, body, body))
    assert "rows" in str(verify_object(wanted, RECORDS[:2], body, body))
    assert "first entry id" in str(verify_object(ArchivedRange("wal_0", 6, 9), RECORDS, body, body))
    assert "last entry id" in str(verify_object(ArchivedRange("wal_0", 7, 10), RECORDS, body, body))
    assert "decode" in str(verify_object(wanted, RECORDS, b"junk", b"junk"))


def test_the_pool_is_named_as_the_leader_names_it() -> None:
    wal = WalSettings(topic_name_prefix="wal", num_topics=3)
    assert pool_topics(wal) == ["wal_0", "wal_1", "wal_2"]


# -- against Kafka and S3 ---------------------------------------------------------------------


class Running:
    """An archiver run in a thread; `stop()` sets its stop event and joins it."""

    def __init__(self, archiver: Archiver) -> None:
        self.archiver = archiver
        self.event = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.archiver.run(self.event)
        except BaseException as exc:  # reported by stop()
            self.errors.append(exc)

    def stop(self) -> None:
        self.event.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the archiver did not stop"
        assert self.errors == []


@pytest.fixture
def running() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for run in started:
        if run.thread.is_alive():
            run.event.set()
            run.thread.join(timeout=30)


def test_records_come_out_as_objects_that_cover_them_and_read_back_equal(
    pool: Pool, store: ObjectStore, kafka_admin: KafkaAdmin, running: list[Running]
) -> None:
    produced = {pool.topics[0]: produce(pool.bootstrap, pool.topics[0], 40)}
    archiver = Archiver(pool.wal_settings(), store)
    running.append(Running(archiver))
    produced[pool.topics[1]] = produce(pool.bootstrap, pool.topics[1], 5)

    ends = {t: records[-1].entry_id + 1 for t, records in produced.items()}
    wait_until(
        lambda: committed(kafka_admin, pool.group, pool.topics) == ends,
        "the group to commit every record produced",
    )
    assert archiver.ready and archiver.assigned == sorted(pool.topics)
    for topic, records in produced.items():
        assert archived_entries(store, topic, ends[topic]) == records
    # 40 records of ~170 bytes do not fit one 4 KB object.
    big = ranges(store, pool.topics[0])
    assert len(big) > 1
    metrics = archiver.metrics.render().decode()
    assert f'metasrv_archiver_written_objects_total{{topic="{pool.topics[0]}"}} {len(big)}.0' in (
        metrics
    )
    no_lag = [f'metasrv_archiver_lag_entries{{topic="{t}"}} 0.0' for t in pool.topics]
    wait_until(  # the gauges follow within a second
        lambda: all(line in archiver.metrics.render().decode() for line in no_lag), "no lag"
    )
    running[0].stop()


@pytest.mark.parametrize("point", list(PausePoint))
def test_the_range_is_committed_only_after_its_object_verifies(
    pool: Pool,
    store: ObjectStore,
    kafka_admin: KafkaAdmin,
    running: list[Running],
    point: PausePoint,
) -> None:
    topic = pool.topics[0]
    records = produce(pool.bootstrap, topic, 3)
    archiver = Archiver(pool.wal_settings(object_max_bytes="1MB"), store, pause_at=point)
    running.append(Running(archiver))
    # Paused at `point` with the object in the bucket: the group has committed nothing.
    [first] = wait_until(lambda: ranges(store, topic), "the object's put")
    assert first.first_entry_id == 0
    assert committed(kafka_admin, pool.group, [topic]) == {topic: None}
    running[0].stop()  # a paused archiver finishes its object: verified, then committed
    assert committed(kafka_admin, pool.group, [topic]) == {topic: first.end}
    assert archived_entries(store, topic, first.end) == records[: first.end]


class DamagingStore(ObjectStore):
    """The real store, with the bytes of every put changed on the way while `damage` is set
    (still a valid object, with its own matching checksum: only verification can tell)."""

    damage = True

    def put(self, key: str, body: bytes) -> None:
        if self.damage:
            rows = decode_object(body)
            body = encode_object([*rows[:-1], replace(rows[-1], value=b"damaged")])
        super().put(key, body)


def test_an_object_that_does_not_verify_is_never_committed_and_is_written_again(
    pool: Pool, kafka_admin: KafkaAdmin, running: list[Running]
) -> None:
    topic = pool.topics[0]
    records = produce(pool.bootstrap, topic, 3)
    settings = pool.wal_settings()
    store = DamagingStore(settings.archive)
    try:
        archiver = Archiver(settings, store)
        running.append(Running(archiver))
        failures = f'metasrv_archiver_verify_failures_total{{topic="{topic}"}} 2.0'
        wait_until(lambda: failures in archiver.metrics.render().decode(), "two verify failures")
        assert committed(kafka_admin, pool.group, [topic]) == {topic: None}

        store.damage = False
        wait_until(lambda: committed(kafka_admin, pool.group, [topic]) == {topic: 3}, "a commit")
        assert archived_entries(store, topic, 3) == records
        running[0].stop()
    finally:
        for obj in store.list(pool.s3_prefix):
            store.delete(obj.key)
        store.close()


def test_with_the_store_down_nothing_is_committed_and_archiving_resumes_once_it_is_back(
    pool: Pool, own_server: StackConfig, kafka_admin: KafkaAdmin, running: list[Running]
) -> None:
    topic = pool.topics[0]
    settings = pool.wal_settings(endpoint=s3_endpoint_of(own_server).endpoint)
    store = ObjectStore(settings.archive, timeout=2.0, max_attempts=1)
    archiver = Archiver(settings, store)
    running.append(Running(archiver))
    produced = produce(pool.bootstrap, topic, 3)
    wait_until(lambda: committed(kafka_admin, pool.group, [topic]) == {topic: 3}, "a commit")
    assert archiver.ready

    stop_service(own_server, "s3")
    produced += produce(pool.bootstrap, topic, 3, start=3)
    errors = 'metasrv_archiver_store_errors_total{operation="put"} 2.0'
    wait_until(lambda: errors in archiver.metrics.render().decode(), "two failed puts")
    assert not archiver.ready
    assert committed(kafka_admin, pool.group, [topic]) == {topic: 3}

    start_service(own_server, "s3")
    wait_until(lambda: committed(kafka_admin, pool.group, [topic]) == {topic: 6}, "the resume")
    assert archiver.ready
    assert archived_entries(store, topic, 6) == produced
    running[0].stop()
    store.close()


def test_a_rebalance_drops_the_revoked_topics_buffers_and_their_next_owner_archives_them(
    pool: Pool, store: ObjectStore, kafka_admin: KafkaAdmin, running: list[Running]
) -> None:
    produced = {t: produce(pool.bootstrap, t, 4) for t in pool.topics}
    # `slow` buffers everything and writes nothing for a minute; `quick` writes at once.
    slow = Archiver(pool.wal_settings(object_max_delay="60s", object_max_bytes="1MB"), store)
    running.append(Running(slow))
    wait_until(lambda: slow.assigned == sorted(pool.topics), "slow to hold the pool")
    held = [f'metasrv_archiver_buffered_entries{{topic="{t}"}} 4.0' for t in pool.topics]
    wait_until(lambda: all(h in slow.metrics.render().decode() for h in held), "slow's reads")

    quick = Archiver(pool.wal_settings(), store)
    running.append(Running(quick))
    [moved] = wait_until(lambda: quick.assigned if len(slow.assigned) == 1 else None, "a split")
    wait_until(lambda: committed(kafka_admin, pool.group, [moved]) == {moved: 4}, "quick's commit")
    assert archived_entries(store, moved, 4) == produced[moved]
    assert [r.first_entry_id for r in ranges(store, moved)] == [0]  # from the committed offset
    [kept] = slow.assigned
    assert committed(kafka_admin, pool.group, [kept]) == {kept: None}

    running[0].stop()  # slow abandons its buffer uncommitted and leaves: quick takes the topic
    wait_until(lambda: committed(kafka_admin, pool.group, [kept]) == {kept: 4}, "the hand-over")
    assert archived_entries(store, kept, 4) == produced[kept]
    assert "metasrv_archiver_written_objects_total{" not in slow.metrics.render().decode()
    running[1].stop()
