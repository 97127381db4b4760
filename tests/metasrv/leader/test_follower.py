"""A follower's warm topic-region map on real etcd, PostgreSQL and SQLite kv stores.

The map is followed from its load's revision; `take_over` brings it to a revision read
after the call, so every region the old leader registered before that is in it (DESIGN §2
invariant 4). Keys deleted behind the follower are never left in its map.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import delete

from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.kv import KvBackend, KvChange, KvWatch, SqlKv, WatchLost
from metasrv.leader import (
    Checkpointer,
    LeaderView,
    Mailbox,
    MapFollower,
    RegionRegistry,
    TopicLocks,
    TopicRegionMap,
)
from metasrv.metrics import Metrics
from metasrv.settings import load_settings
from metasrv.sql import kv_table
from tests._stats import prepared_for
from tests._wait import blocked_in, eventually, wait_until
from tests.metasrv.kv.conftest import KvFactory


@dataclass
class World:
    kv: KvBackend
    """The store as the old leader writes it."""
    region_map: TopicRegionMap
    follower: MapFollower


@pytest.fixture
async def world(kv_store: KvFactory, kafka_bootstrap: str) -> AsyncIterator[World]:
    settings = load_settings(None, wal={"broker_endpoints": [kafka_bootstrap]})
    writer, reader = kv_store("m/"), kv_store("m/")
    region_map = TopicRegionMap(reader, KafkaAdmin(kafka_bootstrap), TopicLocks(), settings)
    follower = MapFollower(region_map, reader)
    follower.start()
    await eventually(lambda: follower.warm, "the follower warm")
    yield World(writer, region_map, follower)
    await follower.stop()


def _register(kv: KvBackend, topic: str, region_ids: range) -> None:
    """As the old leader's registration leaves the store."""
    kv.batch_put([(keys.topic_region(topic, r), keys.encode_route(1, None)) for r in region_ids])


async def test_regions_registered_just_before_take_over_are_in_the_map(world: World) -> None:
    # Written the instant before the election; the follower's polling or stream has not
    # necessarily delivered them: take_over must.
    _register(world.kv, "wal_0", range(1, 201))
    assert await world.follower.take_over(lambda: True)
    assert {r.region_id for r in world.region_map.regions_of("wal_0")} == set(range(1, 201))
    assert world.region_map.revision >= world.kv.get(keys.topic_region("wal_0", 200)).mod_revision  # type: ignore[union-attr]


async def test_checkpoints_and_moves_are_followed(world: World) -> None:
    _register(world.kv, "wal_0", range(1, 4))
    world.kv.put(keys.topic_region("wal_0", 2), keys.encode_route(5, 42))
    world.kv.delete(keys.topic_region("wal_0", 3))
    world.kv.put(keys.topic_region("wal_1", 3), keys.encode_route(1, None))
    await eventually(lambda: world.region_map.topic_of(3) == "wal_1", "region 3 moved to wal_1")
    assert await world.follower.take_over(lambda: True)
    route = world.region_map.route(2)
    assert route is not None and (route.node_id, route.checkpoint_entry_id) == (5, 42)
    assert [r.region_id for r in world.region_map.regions_of("wal_0")] == [1, 2]


async def test_a_region_deregistered_behind_the_follower_leaves_its_map(world: World) -> None:
    _register(world.kv, "wal_0", range(1, 11))
    await eventually(lambda: world.region_map.region_count() == 10, "ten regions followed")
    world.kv.delete(keys.topic_region("wal_0", 7))
    # etcd streams the delete; the SQL poll finds a key missing and reloads in full.
    assert await world.follower.take_over(lambda: True)
    assert world.region_map.route(7) is None
    assert world.region_map.region_count() == 9


async def test_take_over_waits_for_a_first_load_still_running(world: World) -> None:
    await world.follower.stop()
    _register(world.kv, "wal_0", range(1, 51))
    world.follower.start()  # loading again, not warm yet
    assert await world.follower.take_over(lambda: True)
    assert world.region_map.region_count() == 50


async def test_a_follower_whose_watch_broke_reloads_in_full_before_it_serves(
    kv_store: KvFactory, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watch ends under the follower (etcd restarted or its member went away; the SQL
    # poll failing), regions are registered meanwhile and then the follower is elected:
    # the map it serves is a full reload holding every one of them.
    settings = load_settings(None, wal={"broker_endpoints": [kafka_bootstrap]})
    writer, reader = kv_store("m/"), kv_store("m/")
    watches: list[KvWatch] = []
    open_watch = reader.watch

    def watch(*args: Any, **kwargs: Any) -> KvWatch:
        watches.append(open_watch(*args, **kwargs))
        return watches[-1]

    monkeypatch.setattr(reader, "watch", watch)
    region_map = TopicRegionMap(reader, KafkaAdmin(kafka_bootstrap), TopicLocks(), settings)
    follower = MapFollower(region_map, reader)
    _register(writer, "wal_0", range(1, 11))
    follower.start()
    try:
        await eventually(lambda: follower.warm, "the follower warm")
        watches[0].close()  # the stream breaks: its next read fails
        _register(writer, "wal_0", range(11, 21))
        _register(writer, "wal_1", range(21, 23))  # a moment before the election
        assert await follower.take_over(lambda: True)
        assert follower.reloads == 2 and len(watches) == 2
        assert region_map.region_count() == 22
        assert {r.region_id for r in region_map.regions_of("wal_1")} == {21, 22}
    finally:
        await follower.stop()


async def test_take_over_refuses_a_map_that_is_not_followed(world: World) -> None:
    await world.follower.stop()
    assert not await world.follower.take_over(lambda: True)


async def test_a_failed_round_is_reported_and_the_next_one_loads_again(
    kv_store: KvFactory, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What is not a store's trouble (a bug) goes to the supervisor's sink; the follower
    # still loads again after its backoff, as after a store's trouble.
    settings = load_settings(None, wal={"broker_endpoints": [kafka_bootstrap]})
    writer, reader = kv_store("m/"), kv_store("m/")
    region_map = TopicRegionMap(reader, KafkaAdmin(kafka_bootstrap), TopicLocks(), settings)
    load = region_map.load
    calls = 0

    async def first_load_fails(*args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in the first load")
        await load(*args)

    monkeypatch.setattr(region_map, "load", first_load_fails)
    reported: list[BaseException] = []
    follower = MapFollower(region_map, reader, on_error=reported.append)
    _register(writer, "wal_0", range(1, 6))
    follower.start()
    try:
        await eventually(lambda: follower.warm, "the follower warm after its retry")
        assert [str(e) for e in reported] == ["a bug in the first load"]
        assert calls == 2 and follower.reloads == 1 and region_map.region_count() == 5
    finally:
        await follower.stop()


@dataclass
class ViewWorld:
    writer: KvBackend
    registry: RegionRegistry
    follower: MapFollower
    view: LeaderView


@pytest.fixture
async def view_world(kv_store: KvFactory, kafka_bootstrap: str) -> AsyncIterator[ViewWorld]:
    """A follower and the leader view it prepares a stat table for, wired as the daemon
    wires them (a region removed from the map is discarded from the registry)."""
    settings = load_settings(None, wal={"broker_endpoints": [kafka_bootstrap]})
    writer, reader = kv_store("m/"), kv_store("m/")
    region_map = TopicRegionMap(reader, KafkaAdmin(kafka_bootstrap), TopicLocks(), settings)
    registry = RegionRegistry()
    region_map.removal_listeners.append(lambda route: registry.discard(route.region_id))
    follower = MapFollower(region_map, reader)
    view = LeaderView(
        region_map,
        registry,
        Mailbox(registry),
        Checkpointer(region_map, registry, settings, Metrics()),
        still_leading=lambda: True,
        follower=follower,
    )
    yield ViewWorld(writer, registry, follower, view)
    await follower.stop()


async def _follow(w: ViewWorld, topic: str, region_ids: range) -> None:
    """Regions the old leader registered, then the follower loading and following them."""
    _register(w.writer, topic, region_ids)
    w.follower.start()
    await eventually(lambda: w.follower.warm, "the follower warm")


async def test_a_warm_follower_prepares_the_next_terms_table_and_follows_removals(
    view_world: ViewWorld,
) -> None:
    # The next term's stat slots are built while following; a region deregistered or
    # moved meanwhile keeps no slot for its old topic (its report there is not a first
    # report of a mapped region), and one registered meanwhile gets one at take-over.
    w = view_world
    await _follow(w, "wal_0", range(1, 6))
    assert len(w.registry) == 0
    assert prepared_for(w.registry, "wal_0", [1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5]

    w.writer.delete(keys.topic_region("wal_0", 2))
    w.writer.delete(keys.topic_region("wal_0", 3))  # moved
    w.writer.put(keys.topic_region("wal_1", 3), keys.encode_route(1, None))
    _register(w.writer, "wal_0", range(6, 8))
    assert await w.view.load()
    # 2 deregistered: no slot; 3 moved: prepared for its new topic.
    assert prepared_for(w.registry, "wal_0", [1, 2, 3, 6, 7]) == [1, 6, 7]
    assert prepared_for(w.registry, "wal_1", [1, 2, 3, 6, 7]) == [3]
    assert len(w.registry) == 0 and w.registry.untouched


async def test_a_take_over_with_nothing_changed_keeps_the_followers_table(
    view_world: ViewWorld,
) -> None:
    w = view_world
    await _follow(w, "wal_0", range(1, 101))
    prepare = w.registry.prepare
    asked: list[Any] = []

    def recording(topic_regions: Any) -> int:
        asked.append(topic_regions)
        return prepare(topic_regions)

    w.registry.prepare = recording  # type: ignore[method-assign]
    regions = list(range(1, 101))
    assert prepared_for(w.registry, "wal_0", regions) == regions  # while following
    assert await w.view.load()
    assert prepared_for(w.registry, "wal_0", regions) == regions and w.registry.untouched
    assert [list(topic_regions) for topic_regions in asked] == [[]]  # not rebuilt


async def test_a_warm_take_over_prepares_only_the_regions_mapped_since(
    view_world: ViewWorld,
) -> None:
    # The take-over adds slots for what the followed map gained, not a pass over every
    # route: a checkpoint written meanwhile is no new region, nor is one mapped and
    # removed again.
    w = view_world
    await _follow(w, "wal_0", range(1, 101))
    asked: list[tuple[str, list[int]]] = []
    prepare = w.registry.prepare

    def recording(topic_regions: Any) -> int:
        listed = [(topic, list(regions)) for topic, regions in topic_regions]
        asked.extend(listed)
        return prepare(listed)

    w.registry.prepare = recording  # type: ignore[method-assign]
    w.writer.put(keys.topic_region("wal_0", 5), keys.encode_route(1, 42))
    _register(w.writer, "wal_1", range(200, 202))
    _register(w.writer, "wal_0", range(300, 301))
    w.writer.delete(keys.topic_region("wal_0", 300))
    assert await w.view.load()
    assert asked == [("wal_1", [200, 201])]
    assert prepared_for(w.registry, "wal_0", [*range(1, 101), 300]) == list(range(1, 101))
    assert prepared_for(w.registry, "wal_1", [200, 201]) == [200, 201]


@pytest.mark.parametrize("kv_store", ["etcd"], indirect=True)
async def test_take_over_does_not_wait_out_the_watch(
    world: World,
) -> None:
    # The follower's watch waits up to `poll_secs` for changes; a take-over wakes it.
    watch = world.follower._watch
    assert watch is not None
    waits: list[float] = []
    next_changes = watch.next

    def recorded(timeout: float) -> list[KvChange]:
        waits.append(timeout)
        return next_changes(timeout)

    watch.next = recorded  # type: ignore[method-assign]
    world.follower.poll_secs = 30.0
    _register(world.kv, "wal_0", range(1, 3))
    await eventually(lambda: world.region_map.region_count() == 2, "two regions followed")
    # The wait under way is now a 30 s one, with nothing to come.
    await eventually(lambda: 30.0 in waits, "a 30 s wait of the watch")
    started = time.monotonic()
    assert await world.follower.take_over(lambda: True)
    assert time.monotonic() - started < 5.0


def test_a_woken_watch_returns_from_its_wait_at_once_and_loses_no_change(
    kv_store: KvFactory,
) -> None:
    # A take-over wakes the follower's watch so that its catch-up does not wait out the
    # current `next`: here a 30 s one (and a 30 s poll interval on the SQL kv).
    kv = kv_store("w/")
    start = kv.put("p/a", b"1")
    watch: KvWatch = (
        kv.watch("p/", start, holds_after=lambda changes: 1, poll_interval=30.0)
        if isinstance(kv, SqlKv)
        else kv.watch("p/", start, holds_after=lambda changes: 1)
    )
    returned: list[list[KvChange]] = []
    waiter = threading.Thread(target=lambda: returned.append(watch.next(30.0)))
    try:
        waiter.start()
        # Woken from inside its wait, not before it (a wake before `next` is kept for it).
        wait_until(lambda: blocked_in(waiter, "next"), "the watch to wait inside `next`")
        woken = time.monotonic()
        watch.wake()
        waiter.join(10.0)
        assert returned == [[]]
        assert time.monotonic() - woken < 5.0
        kv.put("p/b", b"2")
        changes, revision = watch.sync(5.0)
        assert [c.key for c in changes] == ["p/b"] and revision >= start + 1
    finally:
        watch.close()


@pytest.mark.parametrize("kv_store", ["etcd"], indirect=True)
def test_an_etcd_watch_from_a_compacted_revision_is_lost(kv_store: KvFactory) -> None:
    kv = kv_store("w/")
    first = kv.put("p/a", b"1")
    last = kv.put("p/a", b"2")
    kv.client.compact(last)  # type: ignore[attr-defined]
    watch = kv.watch("p/", first - 1, holds_after=lambda changes: 1)
    try:
        with pytest.raises(WatchLost, match="compacted"):
            watch.next(5.0)
    finally:
        watch.close()


def test_a_sql_watch_counts_keys_only_after_a_marked_delete_or_periodically(
    kv_store: KvFactory,
) -> None:
    # A take-over's `sync` counts the keys under the prefix (to find deletes, which leave
    # nothing to poll) only when a write removed a key since the last matching count
    # (`deleted_revision`); a delete not marked, as a metasrv older than migration 0005
    # makes, is found by the periodic count while following.
    kv = kv_store("w/")
    if not isinstance(kv, SqlKv):
        pytest.skip("the SQL kv's polling watch")
    kv.batch_put([("p/a", b"1"), ("p/b", b"1"), ("p/c", b"1")])
    held = {"p/a", "p/b", "p/c"}

    def holds_after(changes: list[Any]) -> int:
        return len(held | {c.key for c in changes if c.value is not None})

    watch = kv.watch("p/", kv.revision(), holds_after=holds_after)
    try:
        kv.put("p/d", b"1")
        assert [c.key for c in watch.sync(5.0)[0]] == ["p/d"]
        held.add("p/d")  # as the reader applies it
        with kv.engine.begin() as conn:  # an unmarked delete
            removed = conn.execute(delete(kv_table).where(kv_table.c.key == kv.key_prefix + "p/a"))
            assert removed.rowcount == 1
        watch.sync(5.0)  # nothing marked: no count, the delete is not seen here
        deadline = time.monotonic() + 10.0
        with pytest.raises(WatchLost, match="deleted"):  # the periodic count (5 s) finds it
            while time.monotonic() < deadline:
                watch.next(0.1)
    finally:
        watch.close()
    held.discard("p/a")
    watch = kv.watch("p/", kv.revision(), holds_after=holds_after)
    try:
        kv.delete("p/b")  # marked: the next sync counts
        with pytest.raises(WatchLost, match="deleted"):
            watch.sync(5.0)
    finally:
        watch.close()
