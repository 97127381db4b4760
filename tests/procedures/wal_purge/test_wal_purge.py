"""The WAL purge procedure against real Kafka and etcd: DESIGN §2's invariants."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from metasrv import keys
from metasrv.errors import Conflict, NotFound, NotLeader
from procedures import ProcedureState
from procedures.wal_purge import DATA_LOSS_EVENT, WalPurge, advance_marker, submit_purges
from tests._metrics import sample
from tests._wait import eventually
from tests.procedures._harness import Harness
from tests.procedures.conftest import HarnessFactory


async def purge(h: Harness, topic: str, timeout: float = 30.0) -> ProcedureState:
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, timeout)
    assert view.state.terminal, view
    return view.state


async def flushing_world(factory: HarnessFactory, wait: str, flushed: int) -> tuple[Harness, str]:
    """One region on topic 0, 100 records of 100 B, far enough behind to be asked to flush."""
    h = await factory(wal={"flush_trigger_size": "1KB", "flush_wait_timeout": wait})
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 100)
    h.report_topic(topic, 99, record_size=100 * 100, record_num=100)
    h.report(1, topic, flushed=flushed)
    return h, topic


async def submit_until_flushing(h: Harness, topic: str) -> str:
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    await eventually(lambda: h.at_step(pid, "flush"), "the purge at its flush step")
    return pid


async def test_purge_deletes_below_min_prunable_and_moves_marker(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    await h.register(2, topic)
    h.produce(topic, 100)
    h.report(1, topic, flushed=70)
    h.report(2, topic, flushed=40)

    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 30)

    assert view.state is ProcedureState.SUCCEEDED, view
    assert view.outcome is not None and "to 40" in view.outcome
    assert [s.step for s in view.steps] == ["prepare", "purge"]
    assert h.offsets(topic).log_start_offset == 40
    assert h.marker(topic) == 40
    # Region 2 replays from 41 (> its flushed id): readable. Entry 40 itself is kept.
    assert h.readable(topic, 41) and h.readable(topic, 40)
    assert not h.readable(topic, 39)
    [row] = await h.manager.services.history.purges(topic=topic)
    assert (row.prune_point, row.previous_log_start, row.low_watermark) == (40, 0, 40)
    assert row.entries_deleted == 40 and row.procedure_id == pid and not row.logical_delete
    assert sample(h.metrics, "metasrv_wal_purges_total", {"topic": topic}) == 1
    assert sample(h.metrics, "metasrv_wal_pruned_entry_id", {"topic": topic}) == 40
    # The topic's kv lock was released with the terminal write; history has the record.
    assert h.kv.get(keys.lock(topic)) is None
    stored = await h.manager.services.history.get_procedure(pid)
    assert stored is not None and stored.state is ProcedureState.SUCCEEDED
    assert stored.outcome == view.outcome and stored.timings.keys() == {"prepare", "purge"}


async def test_stale_region_blocks_and_is_named(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    await h.register(2, topic)
    h.produce(topic, 50)
    h.report(1, topic, flushed=30)
    h.report(2, topic, flushed=30, age=h.settings.wal.region_stat_ttl + 5)

    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 30)

    assert view.state is ProcedureState.SKIPPED
    assert view.outcome is not None and "2 (stale_stat)" in view.outcome
    assert h.offsets(topic).log_start_offset == 0
    assert h.marker(topic) is None


async def test_region_without_stat_blocks_after_leader_change(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 20)
    h.report(1, topic, flushed=10)
    h.registry.clear()  # what a new leader sees: nothing reported yet (invariant 3)

    view = await h.manager.wait((await submit_purges(h.manager, [topic], reason="t"))[0], 30)

    assert view.state is ProcedureState.SKIPPED
    assert view.outcome is not None and "1 (no_stat)" in view.outcome
    assert h.offsets(topic).log_start_offset == 0


async def test_idle_region_does_not_pin_topic(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    await h.register(2, topic)
    h.produce(topic, 60)
    h.report(1, topic, flushed=50)
    # Region 2 flushed nothing but its memtable is empty at topic latest 59: it needs nothing.
    h.report(2, topic, flushed=-1, latest=59, memtable=0)

    assert await purge(h, topic) is ProcedureState.SUCCEEDED
    assert h.offsets(topic).log_start_offset == 50
    assert h.marker(topic) == 50


async def test_prune_point_never_above_latest_entry(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    await h.register(2, topic)
    h.produce(topic, 10)
    # Flushed up to the latest entry. (A claim above it names entries this topic does not
    # hold: a topic reset, test_topic_reset.py.)
    h.report(1, topic, flushed=9)
    h.report(2, topic, flushed=-1, latest=9, memtable=0)  # idle at the latest entry

    assert await purge(h, topic) is ProcedureState.SUCCEEDED
    offsets = h.offsets(topic)
    # P <= high watermark (invariant 6), and the marker names no entry not yet written:
    # the next entry (offset 10) may be region 2's, and it must replay it.
    assert (offsets.high_watermark, offsets.log_start_offset, h.marker(topic)) == (10, 9, 9)
    # Region 2 writes entry 10 (first making its idle point durable, as datanodes do).
    h.produce(topic, 1)
    h.report(2, topic, flushed=9)
    assert await purge(h, topic) is ProcedureState.SKIPPED  # P = 9 = marker
    replay_start = max(9, h.marker(topic) or -1) + 1
    assert replay_start == 10 and h.readable(topic, replay_start)


async def test_region_that_flushed_nothing_keeps_entry_zero(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    for region in (1, 2):
        await h.register(region, topic)
    h.produce(topic, 10)
    h.report(1, topic, flushed=-1)  # holds entries 0 and 1, flushed nothing
    h.report(2, topic, flushed=9)

    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 30)

    assert view.state is ProcedureState.SKIPPED
    assert view.outcome is not None and view.outcome.startswith("nothing to purge")
    # No marker: region 1 replays from max(-1, None) + 1 = 0.
    assert h.marker(topic) is None
    assert h.readable(topic, 0)


async def test_up_to_date_topic_still_asks_a_lagging_region_to_flush(
    harness_factory: HarnessFactory,
) -> None:
    h = await harness_factory(wal={"flush_trigger_size": "1KB", "flush_wait_timeout": "20s"})
    topic = h.topic(0)
    await h.register(1, topic)
    await h.register(2, topic)
    h.produce(topic, 10, size=100)
    h.report_topic(topic, 9, record_size=10 * 100, record_num=10)
    h.report(1, topic, flushed=3)
    h.report(2, topic, flushed=9)
    assert await purge(h, topic) is ProcedureState.SUCCEEDED  # P = 3, nothing to flush
    assert h.mailbox.pending(1) == []

    h.produce(topic, 90, size=100)
    h.report_topic(topic, 99, record_size=100 * 100, record_num=100)
    h.report(2, topic, flushed=99)
    h.report(1, topic, flushed=3)  # still 3: P = 3 = marker, but 96 entries to replay
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    await eventually(lambda: h.mailbox.pending(1), "the lagging region asked to flush")
    h.report(1, topic, flushed=80)
    view = await h.manager.wait(pid, 30)
    assert view.state is ProcedureState.SUCCEEDED, view
    assert h.marker(topic) == 80


async def test_up_to_date_topic_is_skipped(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 10)
    h.report(1, topic, flushed=5)
    assert await purge(h, topic) is ProcedureState.SUCCEEDED

    [pid] = await submit_purges(h.manager, [topic], reason="again")
    view = await h.manager.wait(pid, 30)
    assert view.state is ProcedureState.SKIPPED
    assert view.outcome is not None and view.outcome.startswith("up to date")
    assert h.marker(topic) == 5


async def test_marker_ahead_of_kafka_is_caught_up(leader: Harness) -> None:
    # A purge moved the marker to 40 and its DeleteRecords never took effect (or a new
    # partition leader had not fetched the log start): Kafka still holds 0..39.
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 60)
    assert await advance_marker(h.manager.services, topic, 40) is None
    h.report(1, topic, flushed=30)  # P = max(30, marker 40) = 40: "up to date" by the marker

    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 30)

    assert view.state is ProcedureState.SUCCEEDED, view
    assert h.offsets(topic).log_start_offset == 40
    assert h.marker(topic) == 40
    assert h.readable(topic, 40) and not h.readable(topic, 39)
    [row] = await h.manager.services.history.purges(topic=topic)
    assert (row.prune_point, row.previous_log_start, row.entries_deleted) == (40, 0, 40)
    # Once Kafka caught up, the topic is up to date.
    assert await purge(h, topic) is ProcedureState.SKIPPED


async def test_retention_overrun_is_reported_and_marker_not_advanced(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    await h.register(2, topic)
    h.produce(topic, 50)
    h.report(1, topic, flushed=40)
    h.report(2, topic, flushed=10)  # needs 11..
    # Someone (retention, another tool) deletes past region 2's need.
    assert h.kafka.delete_records({topic: 30}) == {topic: 30}

    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 30)

    assert view.state is ProcedureState.FAILED
    assert view.error_code == "wal_data_loss"
    assert h.marker(topic) is None
    assert h.offsets(topic).log_start_offset == 30
    events = await h.manager.services.events.read(topic=topic, kinds=[DATA_LOSS_EVENT])
    assert [(e.kind, e.region_id) for e in events] == [(DATA_LOSS_EVENT, 2)]
    assert events[0].details["log_start_offset"] == 30
    assert sample(h.metrics, "metasrv_wal_data_loss_events_total", {"topic": topic}) == 1


async def test_logical_delete_moves_marker_only(harness_factory: HarnessFactory) -> None:
    # Logical delete leaves deletion to Kafka's retention, so it needs a finite one.
    h = await harness_factory(
        wal={"logical_delete": True, "topic_config": {"retention.ms": "604800000"}}
    )
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 30)
    h.report(1, topic, flushed=20)

    assert await purge(h, topic) is ProcedureState.SUCCEEDED
    assert h.marker(topic) == 20
    assert h.offsets(topic).log_start_offset == 0
    [row] = await h.manager.services.history.purges(topic=topic)
    assert row.logical_delete and row.low_watermark is None and row.entries_deleted == 20


async def test_flush_candidates_get_instructions_and_p_follows_their_flush(
    harness_factory: HarnessFactory,
) -> None:
    h = await harness_factory(wal={"flush_trigger_size": "1KB", "flush_wait_timeout": "20s"})
    topic = h.topic(0)
    await h.register(1, topic, node_id=7)
    await h.register(2, topic, node_id=8)
    h.produce(topic, 100, size=100)
    h.report_topic(topic, 99, record_size=100 * 100, record_num=100)
    h.report(1, topic, flushed=95, node_id=7)  # 4 entries x 100 B: below the trigger
    h.report(2, topic, flushed=20, node_id=8)  # 79 entries x 100 B: asked to flush

    [pid] = await submit_purges(h.manager, [topic], reason="test")
    await eventually(lambda: h.mailbox.pending(8), "a flush instruction queued")
    [instruction] = h.mailbox.pending(8)
    assert instruction.region_ids == (2,)
    assert h.mailbox.pending(7) == []
    assert (await h.manager.get(pid)).step == "flush"

    h.report(2, topic, flushed=90, node_id=8)  # the datanode flushed
    view = await h.manager.wait(pid, 30)

    assert view.state is ProcedureState.SUCCEEDED, view
    assert view.data["flushed_regions"] == [2]
    assert h.offsets(topic).log_start_offset == 90
    assert h.marker(topic) == 90


async def test_flush_timeout_purges_to_what_is_safe(harness_factory: HarnessFactory) -> None:
    h, topic = await flushing_world(harness_factory, "1s", flushed=20)  # never flushes

    assert await purge(h, topic) is ProcedureState.SUCCEEDED
    assert h.offsets(topic).log_start_offset == 20


async def test_registration_waits_for_running_purge_and_is_not_harmed(
    harness_factory: HarnessFactory,
) -> None:
    h, topic = await flushing_world(harness_factory, "3s", flushed=60)

    pid = await submit_until_flushing(h, topic)
    assert h.locks.is_write_locked(topic)

    registering = asyncio.create_task(h.register(2, topic))
    await eventually(lambda: h.lock_users(topic) == 2, "the registration queued on the lock")
    # Invariant 4: the registration holds until the purge has finished with the topic.
    assert not registering.done()
    assert not (await h.manager.get(pid)).state.terminal
    await registering
    view = await h.manager.get(pid)
    assert view.state is ProcedureState.SUCCEEDED
    assert h.region_map.route(2) is not None

    # The new region writes after registering; everything it will need is readable.
    hw = h.offsets(topic).high_watermark
    h.produce(topic, 5)
    h.report(2, topic, flushed=hw - 1)
    h.report(1, topic, flushed=hw + 4)
    assert h.readable(topic, hw)
    # And the next purge must not cut below what region 2 needs.
    assert await purge(h, topic) is ProcedureState.SUCCEEDED
    assert h.offsets(topic).log_start_offset == hw - 1
    assert h.readable(topic, hw)


async def test_purge_waits_for_a_registration_in_progress(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 40)
    h.report(1, topic, flushed=30)

    async with h.locks.read(topic):  # a registration holds the shared lock
        [pid] = await submit_purges(h.manager, [topic], reason="test")
        await eventually(lambda: h.lock_users(topic) == 2, "the purge queued on the lock")
        view = await h.manager.get(pid)
        assert not view.state.terminal and view.step == "prepare"
        # The registration completes while the purge waits: the region is in the map
        # the purge will read (inserted directly, as TopicRegionMap.register does under the lock).
        from metasrv.kv import Put

        h.kv.txn([], [Put(keys.topic_region(topic, 2), keys.encode_route(1, None))])
        await h.region_map.load()

    view = await h.manager.wait(pid, 30)
    # Region 2 has not reported yet, so the purge must not touch the topic.
    assert view.state is ProcedureState.SKIPPED
    assert view.outcome is not None and "2 (no_stat)" in view.outcome
    assert h.offsets(topic).log_start_offset == 0


async def test_marker_is_monotonic_under_concurrent_cas(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    targets = [5, 40, 12, 33, 40, 7, 39, 1, 25, 38] * 3
    seen: list[int] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            value = await asyncio.to_thread(h.marker, topic)
            if value is not None:
                seen.append(value)
            await asyncio.sleep(0)  # one loop step between two reads, not a wait

    watcher = asyncio.create_task(watch())
    previous = await asyncio.gather(
        *(advance_marker(h.manager.services, topic, t) for t in targets)
    )
    stop.set()
    await watcher

    assert h.marker(topic) == 40
    assert seen == sorted(seen), "the marker moved backwards"
    # Exactly one CAS created the key; every other saw a value no higher than the final one.
    assert previous.count(None) == 1
    assert all(p is None or p <= 40 for p in previous)
    assert await advance_marker(h.manager.services, topic, 3) == 40
    assert h.marker(topic) == 40


async def test_one_purge_per_topic_and_unknown_topic(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 10)
    async with h.locks.read(topic):  # keep the first purge from finishing
        first = await submit_purges(h.manager, [topic], reason="a")
        second = await submit_purges(h.manager, [topic, topic], reason="b")
        assert second == first
    with pytest.raises(NotFound):
        await submit_purges(h.manager, [topic, "no-such-topic"], reason="c")
    await h.manager.wait(first[0], 30)


async def test_cancel_stops_a_waiting_purge(harness_factory: HarnessFactory) -> None:
    h, topic = await flushing_world(harness_factory, "60s", flushed=10)

    pid = await submit_until_flushing(h, topic)
    view = await h.manager.cancel(pid)

    assert view.state is ProcedureState.CANCELLED
    assert view.error_code == "cancelled"
    assert h.offsets(topic).log_start_offset == 0
    assert h.marker(topic) is None
    assert h.kv.get(keys.lock(topic)) is None
    assert not h.locks.is_write_locked(topic)
    with pytest.raises(Conflict):
        await h.manager.cancel(pid)
    with pytest.raises(NotFound):
        await h.manager.cancel("f" * 32)
    # A new purge of the topic may start at once.
    [again] = await submit_purges(h.manager, [topic], reason="after cancel")
    assert again != pid
    await h.manager.cancel(again)


async def test_max_running_procedures_is_enforced(harness_factory: HarnessFactory) -> None:
    h = await harness_factory(procedure={"max_running_procedures": 2})
    topics = [h.topic(n) for n in range(4)]
    for n, topic in enumerate(topics):
        await h.register(n + 1, topic)
        h.produce(topic, 10)
        h.report(n + 1, topic, flushed=5)

    async with contextlib.AsyncExitStack() as stack:
        for topic in topics:  # registrations in progress on every topic
            await stack.enter_async_context(h.locks.read(topic))
        ids = await submit_purges(h.manager, topics, reason="test")
        # Two purges queue on their topic locks; the other two were started with them and
        # met the slot limit before either reached its lock.
        await eventually(
            lambda: sum(h.lock_users(t) == 2 for t in topics) == 2, "two purges on their locks"
        )
        states = sorted([(await h.manager.get(i)).state.value for i in ids])
        assert states == ["pending", "pending", "running", "running"]
        assert sample(h.metrics, "metasrv_procedures_running") == 2

    views = [await h.manager.wait(i, 30) for i in ids]
    assert [v.state for v in views] == [ProcedureState.SUCCEEDED] * 4
    assert all(h.offsets(t).log_start_offset == 5 for t in topics)


async def test_followers_refuse_to_submit(harness_factory: HarnessFactory) -> None:
    h = await harness_factory()
    follower = await harness_factory(start=False)
    await follower.manager.start()
    await follower.election.start()
    await eventually(lambda: follower.election.leader_addr(), "the follower sees the leader")
    assert not follower.manager.leading
    with pytest.raises(NotLeader) as info:
        await submit_purges(follower.manager, None, reason="test")
    assert info.value.leader == h.name


async def test_resumed_purge_waits_for_the_topic_map(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 30)
    async with h.locks.read(topic):  # leave the purge pending in kv
        [pid] = await submit_purges(h.manager, [topic], reason="test")
        await h.manager.follow()  # as if this leader died here
    # A new term whose map loader runs after the manager resumed the purge.
    h.region_map.unload()
    await h.manager.lead()
    h.report(1, topic, flushed=20)
    await eventually(
        lambda: sample(h.metrics, "metasrv_procedures_running") == 1,
        "the resumed purge running, waiting for the map",
    )
    assert not (await h.manager.get(pid)).state.terminal
    assert h.offsets(topic).log_start_offset == 0

    await h.region_map.load()
    view = await h.manager.wait(pid, 30)
    assert view.state is ProcedureState.SUCCEEDED, view
    assert h.offsets(topic).log_start_offset == 20


async def test_a_clock_stepped_back_does_not_extend_the_flush_wait(
    harness_factory: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    back = [0.0]
    # The purge's wall clock, steppable (NTP, a VM restored); the monotonic one runs on.
    monkeypatch.setattr(WalPurge, "wall_clock", lambda: time.time() - back[0])
    h, topic = await flushing_world(harness_factory, "1s", flushed=20)  # never flushes
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    await eventually(lambda: h.mailbox.pending(1), "a flush instruction queued")
    back[0] = 3600.0  # an hour back, just after the instructions were sent

    # The 1 s wait ends on the monotonic clock, not an hour later.
    view = await h.manager.wait(pid, 20)

    assert view.state is ProcedureState.SUCCEEDED, view
    assert h.offsets(topic).log_start_offset == 20
