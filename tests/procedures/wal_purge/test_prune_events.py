"""Every prune attempt leaves its events, on real Kafka, etcd and a migrated SQLite history.

A purge that deletes: `purge_started` then `purge_deleted` with its target, Kafka's log
start before and after, and the high watermark. Nothing to cut: `purge_skipped` with the
reason. Kafka unreachable: `purge_retrying` with the error, once per retry, then
`purge_failed`. Entries a region needs deleted behind metasrv's back: `wal_data_loss` per
region, then `purge_failed`. A cancelled purge: `purge_cancelled`. And when the events
cannot be written at all, the purge still succeeds and the drop is counted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from sqlalchemy import text

from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.wire import EventKind, WalEvent
from procedures import ProcedureState
from procedures.wal_purge import submit_purges
from tests._metrics import sample
from tests._wait import eventually
from tests.procedures._harness import Harness, make_settings
from tests.procedures.conftest import HarnessFactory
from toolbox.simulator import free_port

K = EventKind


async def _purge(h: Harness, topic: str, timeout: float = 60) -> str:
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    await h.manager.wait(pid, timeout)
    return pid


async def _events_of(h: Harness, pid: str) -> list[WalEvent]:
    """The procedure's events, oldest first."""
    events = await h.services.events.read(limit=1000)
    return [e for e in reversed(events) if e.procedure_id == pid]


def _kinds(events: Sequence[WalEvent]) -> list[str]:
    return [e.kind for e in events]


async def test_a_purge_that_deletes_records_started_then_deleted(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 50)
    h.report(1, topic, flushed=30)
    before = time.time()

    pid = await _purge(h, topic)

    assert (await h.manager.get(pid)).state is ProcedureState.SUCCEEDED
    events = await _events_of(h, pid)
    assert _kinds(events) == [K.PURGE_STARTED, K.PURGE_DELETED]
    started, deleted = events
    assert all(e.topic == topic for e in events)
    assert started.details == {"resumed": False}
    assert started.target is None and started.log_start_before is None
    assert (deleted.target, deleted.log_start_before, deleted.log_start_after) == (30, 0, 30)
    assert deleted.high_watermark == 50
    assert deleted.message == f"pruned {topic} to 30: 30 entries deleted"
    assert deleted.details["logical_delete"] is False
    assert deleted.details["trigger"] == "test"
    assert before <= started.at.timestamp() <= deleted.at.timestamp() <= time.time()
    assert h.offsets(topic).log_start_offset == 30


async def test_nothing_to_cut_and_blocked_are_skipped_with_their_reason(leader: Harness) -> None:
    h = leader
    topic, blocked = h.topic(0), h.topic(1)
    await h.register(1, topic)
    await h.register(2, blocked)  # never reports
    h.produce(topic, 40)
    h.produce(blocked, 10)
    h.report(1, topic, flushed=20)
    await _purge(h, topic)

    again = await _purge(h, topic)  # P = 20 = the marker: nothing to cut
    stuck = await _purge(h, blocked)

    events = await _events_of(h, again)
    assert _kinds(events) == [K.PURGE_STARTED, K.PURGE_SKIPPED]
    skipped = events[-1]
    assert skipped.message == "up to date: prune point 20 <= pruned_entry_id 20"
    assert (skipped.target, skipped.log_start_before, skipped.high_watermark) == (20, 20, 40)
    assert skipped.log_start_after is None
    events = await _events_of(h, stuck)
    assert _kinds(events) == [K.PURGE_STARTED, K.PURGE_SKIPPED]
    skipped = events[-1]
    assert skipped.message == "blocked by 2 (no_stat)"
    assert skipped.target is None
    assert (skipped.log_start_before, skipped.high_watermark) == (0, 10)
    assert h.offsets(blocked).log_start_offset == 0


async def test_kafka_unreachable_retries_with_the_error_then_fails(
    kafka_bootstrap: str, etcd_endpoint: str, unique_prefix: str, history_url: str
) -> None:
    # The shared broker keeps running (other tests use it); this leader's Kafka client is
    # given an address where no broker listens, which it meets as it would a stopped broker.
    settings = make_settings(
        kafka=kafka_bootstrap,
        etcd=etcd_endpoint,
        prefix=unique_prefix,
        procedure={"max_retry_times": 2, "retry_delay": "50ms"},
    )
    dead = KafkaAdmin(f"127.0.0.1:{free_port()}", request_timeout=1.0)
    h = Harness(settings, history_url, kafka=dead)
    topic = h.topic(0)
    # The region's route, as a registration writes it (registering needs Kafka).
    h.kv.put(keys.topic_region(topic, 1), keys.encode_route(1, None))
    try:
        await h.start()
        h.report(1, topic, flushed=10)

        pid = await _purge(h, topic)

        view = await h.manager.get(pid)
        assert view.state is ProcedureState.FAILED and view.error_code == "kafka_unavailable"
        events = await _events_of(h, pid)
        assert _kinds(events) == [
            K.PURGE_STARTED,
            K.PURGE_RETRYING,
            K.PURGE_RETRYING,
            K.PURGE_FAILED,
        ]
        for retrying in events[1:3]:
            assert retrying.details == {"error_code": "kafka_unavailable"}
            assert retrying.message and topic in retrying.message
        failed = events[-1]
        assert failed.details["error_code"] == "kafka_unavailable"
        assert failed.message == view.error
        dropped = sample(h.metrics, "metasrv_wal_events_dropped_total", {"reason": "write_failed"})
        assert dropped == 0
    finally:
        await h.close()
        dead.close()
        cleaner = EtcdKv([etcd_endpoint], f"{unique_prefix}/")
        cleaner.delete_prefix("")
        cleaner.close()


async def test_data_loss_is_an_event_per_region_then_the_purge_fails(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    await h.register(2, topic)
    h.produce(topic, 50)
    h.report(1, topic, flushed=40)
    h.report(2, topic, flushed=10)  # needs 11..
    assert h.kafka.delete_records({topic: 30}) == {topic: 30}

    pid = await _purge(h, topic)

    events = await _events_of(h, pid)
    assert _kinds(events) == [K.PURGE_STARTED, K.WAL_DATA_LOSS, K.PURGE_FAILED]
    loss, failed = events[1:]
    assert loss.region_id == 2
    assert (loss.log_start_before, loss.high_watermark) == (30, 50)
    assert loss.details["prunable_entry_id"] == 10
    assert loss.message and "region 2" in loss.message
    assert failed.details["error_code"] == "wal_data_loss"
    assert (failed.log_start_before, failed.high_watermark) == (30, 50)
    assert h.marker(topic) is None


async def test_a_cancelled_purge_is_recorded(harness_factory: HarnessFactory) -> None:
    # A region far behind is asked to flush; the purge waits for it and is cancelled.
    h = await harness_factory(wal={"flush_trigger_size": "1KB", "flush_wait_timeout": "30s"})
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 100)
    h.report_topic(topic, 99, record_size=100 * 100, record_num=100)
    h.report(1, topic, flushed=30)
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    await eventually(lambda: h.at_step(pid, "flush"), "the purge at its flush step")

    view = await h.manager.cancel(pid)

    assert view.state is ProcedureState.CANCELLED
    events = await _events_of(h, pid)
    assert _kinds(events) == [K.PURGE_STARTED, K.PURGE_CANCELLED]
    cancelled = events[-1]
    assert cancelled.details["error_code"] == "cancelled"
    assert cancelled.details["flush_asked"] == [1] and cancelled.details["flushed"] == []
    assert cancelled.target == 30 and cancelled.high_watermark == 100


@pytest.mark.timeout(120)
async def test_a_history_database_that_refuses_events_neither_blocks_nor_fails_a_purge(
    leader: Harness,
) -> None:
    h = leader
    with h.engine.begin() as conn:
        conn.execute(text("DROP TABLE wal_events"))  # every event write now fails
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 30)
    h.report(1, topic, flushed=20)

    started = time.monotonic()
    pid = await _purge(h, topic)
    took = time.monotonic() - started

    view = await h.manager.get(pid)
    assert view.state is ProcedureState.SUCCEEDED, view
    assert h.offsets(topic).log_start_offset == 20
    assert [p.procedure_id for p in await h.services.history.purges(topic=topic)] == [pid]
    # The purge did not wait for the writes' retries (0.2 s + 1 s after the first try).
    assert took < 1.2, took
    assert await h.services.events.flush(10)
    assert h.services.events.pending == 0
    dropped = sample(h.metrics, "metasrv_wal_events_dropped_total", {"reason": "write_failed"})
    assert dropped == 2  # started and deleted
