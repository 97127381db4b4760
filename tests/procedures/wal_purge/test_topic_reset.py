"""A topic reset inside the purge (DESIGN §2 invariant 8), on real Kafka and etcd.

A WAL topic deleted and recreated under metasrv starts again at offset 0: the entries
regions write there are unflushed, whatever the regions reported about the old topic.
A purge must find the reset, latch it into the marker, report it (event, metric), delete
nothing and fail with `topic_reset`. On ef11397 this purge answered "pruned to 29: 29
entries deleted".
"""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from metasrv import keys
from procedures import ProcedureState
from procedures.wal_purge import submit_purges
from tests._metrics import sample
from tests._wait import eventually
from tests.procedures._harness import Harness
from tests.procedures.conftest import HarnessFactory


async def recreate(h: Harness, topic: str) -> None:
    """Delete `topic` and create it again under the same name, as an operator, a clean-up
    script or auto-create would; return once Kafka serves the new, empty topic."""
    admin = AdminClient({"bootstrap.servers": h.bootstrap})
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result()

    async def gone() -> bool:
        return topic not in (await asyncio.to_thread(admin.list_topics, timeout=10)).topics

    await eventually(gone, f"{topic} is deleted", timeout=60, interval=0.2)

    async def created() -> bool:
        futures = admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30)
        try:
            await asyncio.to_thread(futures[topic].result)
        except Exception as exc:  # still being deleted: TOPIC_ALREADY_EXISTS, retried
            return "already exists" not in str(exc).lower() and _raise(exc)
        return True

    await eventually(created, f"{topic} is created again", timeout=60, interval=0.2)

    async def served() -> bool:
        try:
            offsets = await asyncio.to_thread(h.offsets, topic)
        except Exception:  # the new partition has no leader yet
            return False
        return (offsets.log_start_offset, offsets.high_watermark) == (0, 0)

    await eventually(served, f"Kafka serves the new {topic}", timeout=60, interval=0.2)


def _raise(exc: Exception) -> bool:
    raise exc


@pytest.mark.parametrize("with_topic_id", [True, False], ids=["topic_id", "no_topic_id"])
async def test_a_recreated_topic_is_a_topic_reset_and_nothing_is_deleted(
    leader: Harness, with_topic_id: bool
) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 100)
    h.report(1, topic, flushed=60)
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    first = await h.manager.wait(pid, 60)
    assert first.state is ProcedureState.SUCCEEDED, first
    assert h.marker(topic) == 60
    assert h.offsets(topic).log_start_offset == 60
    if not with_topic_id:
        # A marker written before metasrv recorded topic ids: only the offsets tell.
        h.kv.put(keys.topic_name(topic), b'{"pruned_entry_id": 60}')

    await recreate(h, topic)
    # The region writes 30 new entries (offsets 0-29 of the new topic) and reports what it
    # believes: flushed up to 60.
    h.produce(topic, 30)
    h.report(1, topic, flushed=60)

    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 60)

    assert view.state is ProcedureState.FAILED, view
    assert view.error_code == "topic_reset", view
    # Nothing deleted: every acknowledged entry of the new topic is still there.
    offsets = h.offsets(topic)
    assert (offsets.log_start_offset, offsets.high_watermark) == (0, 30)
    assert h.readable(topic, 0)
    # The reset is latched into the marker, the entry id kept.
    stored = h.kv.get(keys.topic_name(topic))
    assert stored is not None
    marker = keys.decode_marker(stored.value)
    assert marker.pruned_entry_id == 60
    assert marker.reset is not None
    reason = "topic_id_changed" if with_topic_id else "high_watermark_below_marker"
    assert marker.reset.reason.startswith(reason), marker
    assert marker.reset.high_watermark == 30
    assert marker.reset.detected_topic_id == offsets.topic_id
    if with_topic_id:
        assert marker.topic_id is not None and marker.topic_id != offsets.topic_id
    # Reported: an event and the metrics.
    events = [e for e in await h.services.events.read(limit=1000) if e.procedure_id == pid]
    [reset] = [e for e in events if e.kind == "topic_reset"]
    assert reset.details["pruned_entry_id"] == 60 and reset.high_watermark == 30
    metrics = h.services.metrics
    assert sample(metrics, "metasrv_wal_topic_resets_total", {"topic": topic}) == 1
    assert sample(metrics, "metasrv_wal_topic_reset", {"topic": topic}) == 1
    assert sample(metrics, "metasrv_wal_entries_deleted_total", {"topic": topic}) == 60

    # Latched: the next purge fails again without a second event, still deleting nothing,
    # even once the new topic's high watermark has passed the old marker.
    h.produce(topic, 40)
    h.report(1, topic, flushed=69)
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    again = await h.manager.wait(pid, 60)
    assert again.state is ProcedureState.FAILED and again.error_code == "topic_reset", again
    assert h.offsets(topic).log_start_offset == 0
    assert sample(metrics, "metasrv_wal_topic_resets_total", {"topic": topic}) == 1


async def test_a_region_reporting_entries_the_topic_lacks_is_a_topic_reset(
    harness_factory: HarnessFactory,
) -> None:
    # Never purged (no marker): a recreated topic shows only in the regions' reports,
    # which name entries above the new high watermark - 1.
    h = await harness_factory()
    topic = h.topic(0)
    await h.register(1, topic)
    await h.register(2, topic)
    h.produce(topic, 10)
    h.report(1, topic, flushed=500)
    h.report(2, topic, flushed=5)

    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 60)

    assert view.state is ProcedureState.FAILED and view.error_code == "topic_reset", view
    assert h.offsets(topic).log_start_offset == 0
    stored = h.kv.get(keys.topic_name(topic))
    assert stored is not None
    marker = keys.decode_marker(stored.value)
    assert marker.pruned_entry_id is None
    assert marker.reset is not None
    assert marker.reset.reason.startswith("regions_ahead_of_high_watermark"), marker
    events = [e for e in await h.services.events.read(limit=1000) if e.procedure_id == pid]
    [reset] = [e for e in events if e.kind == "topic_reset"]
    assert reset.details["regions"] == [1]


async def test_a_marker_advance_records_kafkas_topic_id(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 20)
    h.report(1, topic, flushed=10)
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    assert (await h.manager.wait(pid, 60)).state is ProcedureState.SUCCEEDED

    stored = h.kv.get(keys.topic_name(topic))
    assert stored is not None
    marker = keys.decode_marker(stored.value)
    assert marker.pruned_entry_id == 10
    assert marker.topic_id is not None
    assert marker.topic_id == h.offsets(topic).topic_id


async def test_a_damaged_marker_fails_the_purge_without_retries(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 20)
    h.report(1, topic, flushed=10)
    h.kv.put(keys.topic_name(topic), b'{"pruned_entry_id": "ten"}')

    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 60)

    assert view.state is ProcedureState.FAILED and view.error_code == "damaged_marker", view
    assert view.attempts == 1, view
    assert h.offsets(topic).log_start_offset == 0


async def test_a_topic_recreated_while_a_purge_waits_for_a_flush(
    harness_factory: HarnessFactory,
) -> None:
    # The purge planned P = 20 on the old topic and asked region 1 to flush; meanwhile the
    # topic is recreated and the region, writing on, reports flushed 60 of the old one.
    h = await harness_factory(wal={"flush_trigger_size": "1KB", "flush_wait_timeout": "30s"})
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 100)
    h.report_topic(topic, 99, record_size=100 * 100, record_num=100)
    h.report(1, topic, flushed=20)
    [pid] = await submit_purges(h.manager, [topic], reason="test")

    async def flushing() -> bool:
        return (await h.manager.get(pid)).step == "flush" and bool(h.mailbox.pending(1))

    await eventually(flushing, "the purge waits for the flush", timeout=60, interval=0.2)
    await recreate(h, topic)
    h.produce(topic, 30)
    h.report(1, topic, flushed=60)  # "flushed": the wait ends, the step plans again

    view = await h.manager.wait(pid, 60)

    assert view.state is ProcedureState.FAILED and view.error_code == "topic_reset", view
    assert h.offsets(topic).log_start_offset == 0
    stored = h.kv.get(keys.topic_name(topic))
    assert stored is not None
    # The id its registration recorded is checked before the reports (which are also
    # above the new high watermark - 1).
    reset = keys.decode_marker(stored.value).reset
    assert reset is not None and reset.reason.startswith("topic_id_changed"), reset


async def test_a_topic_recreated_during_its_first_purge_is_a_topic_reset(
    harness_factory: HarnessFactory,
) -> None:
    # Issue #34, found by the protocol model. Never purged, so no marker records Kafka's
    # topic id: the purge's prepare plans P = 20 on the old topic and asks region 1 to
    # flush. Meanwhile the topic is recreated, the region writes 30 entries on the new one
    # (offsets 0-29) and reports flushed 25, a value the new topic could hold: no marker
    # and no report tells the new topic from the old one. Only the topic id prepare planned
    # on does; without it the purge moved the marker to 25 and deleted new entries 0-24.
    h = await harness_factory(wal={"flush_trigger_size": "1KB", "flush_wait_timeout": "30s"})
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 100)
    h.report_topic(topic, 99, record_size=100 * 100, record_num=100)
    h.report(1, topic, flushed=20)
    old_id = h.offsets(topic).topic_id
    assert old_id is not None
    [pid] = await submit_purges(h.manager, [topic], reason="test")

    async def flushing() -> bool:
        return (await h.manager.get(pid)).step == "flush" and bool(h.mailbox.pending(1))

    await eventually(flushing, "the purge waits for the flush", timeout=60, interval=0.2)
    stored = h.kv.get(keys.topic_name(topic))  # never purged: the registration's id only
    assert stored is not None and keys.decode_marker(stored.value) == keys.Marker(None, old_id)
    await recreate(h, topic)
    h.produce(topic, 30)
    h.report(1, topic, flushed=25)  # "flushed": the wait ends, the step plans again

    view = await h.manager.wait(pid, 60)

    assert view.state is ProcedureState.FAILED and view.error_code == "topic_reset", view
    # Nothing deleted: every entry of the new topic is still there.
    offsets = h.offsets(topic)
    assert (offsets.log_start_offset, offsets.high_watermark) == (0, 30)
    assert h.readable(topic, 0)
    assert offsets.topic_id is not None and offsets.topic_id != old_id
    # The reset is latched with Kafka's new id; the marker was never moved.
    stored = h.kv.get(keys.topic_name(topic))
    assert stored is not None
    marker = keys.decode_marker(stored.value)
    assert marker.pruned_entry_id is None
    assert marker.reset is not None and marker.reset.reason.startswith("topic_id_changed"), marker
    assert marker.reset.detected_topic_id == offsets.topic_id
    events = [e for e in await h.services.events.read(limit=1000) if e.procedure_id == pid]
    assert [e.kind for e in events].count("topic_reset") == 1
    assert sample(h.services.metrics, "metasrv_wal_topic_reset", {"topic": topic}) == 1


async def test_a_topic_recreated_before_its_first_purge_is_a_topic_reset(
    leader: Harness,
) -> None:
    # Issue #34, found by the protocol model. The region's report (flushed 60) is of the
    # old topic; the new one has 80 entries it has not flushed, and 60 < 80 - 1 passes
    # every check of the offsets. Only the topic id its registration recorded tells the
    # topics apart (before, the purge deleted the new topic's entries 0-59).
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    old_id = h.offsets(topic).topic_id
    stored = h.kv.get(keys.topic_name(topic))
    assert old_id is not None and stored is not None
    assert keys.decode_marker(stored.value) == keys.Marker(None, old_id)
    h.produce(topic, 100)
    h.report(1, topic, flushed=60)
    await recreate(h, topic)
    h.produce(topic, 80)

    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 60)

    assert view.state is ProcedureState.FAILED and view.error_code == "topic_reset", view
    offsets = h.offsets(topic)
    assert (offsets.log_start_offset, offsets.high_watermark) == (0, 80)
    assert h.readable(topic, 0)
    stored = h.kv.get(keys.topic_name(topic))
    assert stored is not None
    marker = keys.decode_marker(stored.value)
    assert marker.pruned_entry_id is None and marker.topic_id == old_id
    assert marker.reset is not None and marker.reset.reason.startswith("topic_id_changed"), marker
    assert marker.reset.detected_topic_id == offsets.topic_id != old_id
