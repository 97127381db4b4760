"""Checkpointer on real etcd: batched writes, interval, unchanged skipped, shutdown flush."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import orjson
import pytest

from metasrv import keys
from metasrv.errors import KvUnavailable
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.leader import Checkpointer, RegionRegistry, TopicLocks, TopicRegionMap
from metasrv.metrics import Metrics
from metasrv.model import RegionStat
from metasrv.settings import Settings, load_settings
from tests._metrics import sample
from tests._stats import report
from tests._wait import eventually

TOPIC = "cp_0"


class World:
    def __init__(self, kv: EtcdKv, kafka: KafkaAdmin, settings: Settings) -> None:
        self.kv = kv
        self.registry = RegionRegistry()
        self.metrics = Metrics()
        self.region_map = TopicRegionMap(kv, kafka, TopicLocks(), settings)
        self.settings = settings
        self.leader = True
        self.checkpointer = Checkpointer(
            self.region_map, self.registry, settings, self.metrics, may_write=lambda: self.leader
        )

    def report(self, region_id: int, flushed: int, node_id: int = 1) -> None:
        stat = RegionStat(region_id, node_id, TOPIC, flushed, None, 0, 1, 0.0)
        report(self.registry, [stat])
        self.checkpointer.mark([region_id])

    def checkpoint(self, region_id: int) -> int | None:
        stored = self.kv.get(keys.topic_region(TOPIC, region_id))
        assert stored is not None
        cp = orjson.loads(stored.value)["checkpoint"]
        return None if cp is None else int(cp["entry_id"])

    @property
    def written(self) -> float:
        return sample(self.metrics, "metasrv_checkpoint_keys_written_total")


async def make_world(etcd_endpoint: str, kafka_bootstrap: str, prefix: str, **wal: object) -> World:
    settings = load_settings(None, wal={"broker_endpoints": [kafka_bootstrap], **wal})
    kv = EtcdKv(etcd_endpoint, f"{prefix}/")
    kv.batch_put([(keys.topic_region(TOPIC, r), keys.encode_route(1, None)) for r in range(1, 11)])
    w = World(kv, KafkaAdmin(kafka_bootstrap), settings)
    await w.region_map.load()
    return w


@pytest.fixture
async def world(
    etcd_endpoint: str, kafka_bootstrap: str, unique_prefix: str
) -> AsyncIterator[World]:
    # Interval long enough that only the batch size or an explicit flush writes.
    w = await make_world(
        etcd_endpoint, kafka_bootstrap, unique_prefix, checkpoint_interval="1h", checkpoint_batch=5
    )
    yield w
    await w.checkpointer.stop()
    w.kv.delete_prefix("")
    w.kv.close()


async def test_nothing_written_until_batch_is_full(world: World) -> None:
    await world.checkpointer.start()
    for region_id in range(1, 5):
        world.report(region_id, 10 + region_id)
    assert world.written == 0
    assert world.checkpoint(1) is None
    world.report(5, 15)  # fifth dirty region: a full batch
    await eventually(lambda: world.written == 5, "the full batch written")
    assert [world.checkpoint(r) for r in range(1, 6)] == [11, 12, 13, 14, 15]
    assert world.checkpointer.flushes == 1  # the four before it were not written alone


async def test_a_new_term_writes_nothing_until_every_mapped_region_reported(world: World) -> None:
    world.checkpointer.clear()  # a new term (`LeaderView`)
    await world.checkpointer.start()
    for region_id in range(1, 10):  # full batches, but region 10 of the map is not in
        world.report(region_id, 20 + region_id)
    assert world.written == 0
    world.report(10, 30)
    await eventually(lambda: world.written == 10, "every region written")
    assert [world.checkpoint(r) for r in (1, 10)] == [21, 30]
    assert world.checkpointer.flushes == 1  # the nine full ones were held, not written


async def test_a_new_terms_hold_ends_after_one_interval(
    etcd_endpoint: str, kafka_bootstrap: str, unique_prefix: str
) -> None:
    w = await make_world(
        etcd_endpoint, kafka_bootstrap, unique_prefix, checkpoint_interval="1s", checkpoint_batch=1
    )
    try:
        w.checkpointer.clear()
        await w.checkpointer.start()
        loop = asyncio.get_running_loop()
        started = loop.time()
        w.report(1, 33)  # one region of ten: the first round never completes
        await eventually(lambda: w.written == 1, "the held region written")
        assert 0.9 <= loop.time() - started < 3.0
        assert w.checkpoint(1) == 33
    finally:
        await w.checkpointer.stop()
        w.kv.delete_prefix("")
        w.kv.close()


async def test_interval_flushes_a_partial_batch(
    etcd_endpoint: str, kafka_bootstrap: str, unique_prefix: str
) -> None:
    w = await make_world(
        etcd_endpoint,
        kafka_bootstrap,
        unique_prefix,
        checkpoint_interval="200ms",
        checkpoint_batch=1000,
    )
    try:
        await w.checkpointer.start()
        w.report(1, 33)
        await eventually(lambda: w.written == 1, "the partial batch written")
        assert w.checkpoint(1) == 33
    finally:
        await w.checkpointer.stop()
        w.kv.delete_prefix("")
        w.kv.close()


async def test_many_reports_of_one_region_are_one_write(world: World) -> None:
    for flushed in range(100):
        world.report(1, flushed)
    assert await world.checkpointer.flush() == 1
    assert world.checkpoint(1) == 99
    # Unchanged since the last write: nothing to write.
    world.report(1, 99)
    assert await world.checkpointer.flush() == 0


async def test_stop_flushes_what_is_dirty(world: World) -> None:
    await world.checkpointer.start()
    world.report(2, 7)
    await world.checkpointer.stop()
    assert world.checkpoint(2) == 7
    await world.checkpointer.stop()  # repeat-safe


async def test_follower_writes_nothing(world: World) -> None:
    world.leader = False
    world.report(3, 9)
    assert await world.checkpointer.flush() == 0
    assert world.checkpoint(3) is None
    assert world.checkpointer.dirty_count == 0


async def test_deregistered_region_is_not_resurrected(world: World) -> None:
    world.report(4, 9)
    await world.region_map.deregister(4)
    assert await world.checkpointer.flush() == 0
    assert world.kv.get(keys.topic_region(TOPIC, 4)) is None


async def test_kv_failure_keeps_regions_dirty(
    etcd_endpoint: str, kafka_bootstrap: str, unique_prefix: str
) -> None:
    w = await make_world(etcd_endpoint, kafka_bootstrap, unique_prefix)
    try:
        w.report(1, 5)
        w.kv.close()  # the backend now refuses every call
        with pytest.raises(KvUnavailable):
            await w.checkpointer.flush()
        assert w.checkpointer.dirty_count == 1
    finally:
        cleanup = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
        cleanup.delete_prefix("")
        cleanup.close()


async def test_full_batches_in_quick_succession_coalesce(
    etcd_endpoint: str, kafka_bootstrap: str, unique_prefix: str
) -> None:
    # Interval 2s -> flushes at least 0.2s apart, however fast batches fill.
    w = await make_world(
        etcd_endpoint, kafka_bootstrap, unique_prefix, checkpoint_interval="2s", checkpoint_batch=2
    )
    try:
        assert w.checkpointer.min_gap == pytest.approx(0.2)
        await w.checkpointer.start()
        w.report(1, 1)
        w.report(2, 1)  # a full batch: written at once
        await eventually(lambda: w.written == 2, "the first batch written")
        for flushed in range(2, 40):  # 19 more full batches of the same two regions
            w.report(1, flushed)
            w.report(2, flushed)
            await asyncio.sleep(0.005)  # the scenario: changes arriving over ~0.2 s
        await eventually(
            lambda: w.checkpoint(1) == 39 and w.checkpoint(2) == 39, "the last batch written"
        )
        # ~0.2s of changes coalesced into one or two flushes, not 19.
        assert w.checkpointer.flushes <= 3
    finally:
        await w.checkpointer.stop()
        w.kv.delete_prefix("")
        w.kv.close()


async def test_a_flush_larger_than_a_slice_writes_every_region_and_keeps_the_rest_dirty_on_failure(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.checkpointer = Checkpointer(
        world.region_map, world.registry, world.settings, world.metrics, flush_slice=3
    )
    for region_id in range(1, 11):
        world.report(region_id, 100 + region_id)
    assert await world.checkpointer.flush() == 10  # four slices of at most 3
    assert [world.checkpoint(r) for r in range(1, 11)] == [100 + r for r in range(1, 11)]

    for region_id in range(1, 11):
        world.report(region_id, 200 + region_id)
    real = world.region_map.set_checkpoints
    calls = 0

    async def second_slice_fails(updates: dict[int, tuple[int, int]]) -> int:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KvUnavailable("injected")
        return await real(updates)

    monkeypatch.setattr(world.region_map, "set_checkpoints", second_slice_fails)
    with pytest.raises(KvUnavailable):
        await world.checkpointer.flush()
    # The first slice was written; the failed slice and every later one are still dirty.
    assert world.checkpointer.dirty_count == 7
    monkeypatch.setattr(world.region_map, "set_checkpoints", real)
    assert await world.checkpointer.flush() == 7
    assert [world.checkpoint(r) for r in range(1, 11)] == [200 + r for r in range(1, 11)]


@contextlib.asynccontextmanager
async def paced_world(
    etcd_endpoint: str, kafka_bootstrap: str, prefix: str, rate: int
) -> AsyncIterator[World]:
    """A world whose background writer only writes full batches of ten, at `rate`."""
    w = await make_world(
        etcd_endpoint,
        kafka_bootstrap,
        prefix,
        checkpoint_interval="1h",
        checkpoint_batch=10,
        checkpoint_rate=rate,
    )
    try:
        yield w
    finally:
        await w.checkpointer.stop()
        w.kv.delete_prefix("")
        w.kv.close()


async def test_the_background_writer_keeps_to_the_rate_and_stop_writes_the_rest(
    etcd_endpoint: str, kafka_bootstrap: str, unique_prefix: str
) -> None:
    # Two regions a second, a step of one region: ten regions would take 4.5 s.
    async with paced_world(etcd_endpoint, kafka_bootstrap, unique_prefix, 2) as w:
        await w.checkpointer.start()
        for region_id in range(1, 11):
            w.report(region_id, 100 + region_id)
        await eventually(lambda: w.written >= 2, "two regions written")
        loop = asyncio.get_running_loop()
        started = loop.time()
        await eventually(lambda: w.written >= 4, "four regions written")
        assert loop.time() - started >= 0.9  # two regions more at two a second: 1 s
        assert w.written < 10
        started = loop.time()
        await w.checkpointer.stop()  # does not wait out the pace: the rest at once
        assert loop.time() - started < 2.0
        assert w.written == 10
        assert [w.checkpoint(r) for r in range(1, 11)] == [100 + r for r in range(1, 11)]


async def test_a_paced_flush_drops_what_it_holds_when_leadership_changes(
    etcd_endpoint: str, kafka_bootstrap: str, unique_prefix: str
) -> None:
    async with paced_world(etcd_endpoint, kafka_bootstrap, unique_prefix, 5) as w:
        await w.checkpointer.start()
        for region_id in range(1, 11):
            w.report(region_id, 9)
        await eventually(lambda: w.written >= 1, "a region written")
        w.checkpointer.clear()  # what `Runtime` does when leadership changes
        # The paced flush sees the change at its next step and ends (a flush that wrote
        # something is counted when it returns).
        await eventually(lambda: w.checkpointer.flushes == 1, "the paced flush given up")
        assert w.written <= 2
        await w.checkpointer.stop()
        assert w.written <= 2  # nothing of the old term is written on stop either


async def test_an_explicit_flush_is_not_paced(
    etcd_endpoint: str, kafka_bootstrap: str, unique_prefix: str
) -> None:
    async with paced_world(etcd_endpoint, kafka_bootstrap, unique_prefix, 1) as w:
        for region_id in range(1, 11):
            w.report(region_id, 5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await w.checkpointer.flush() == 10
        assert loop.time() - started < 2.0  # paced, ten regions at one a second: 9 s


def test_encode_route_is_the_json_orjson_writes() -> None:
    for node_id, entry_id in [(1, None), (0, 5), (-1, 2**63 - 1), (7, -1), (2**63 - 1, 0)]:
        checkpoint = None if entry_id is None else {"entry_id": entry_id}
        expected = orjson.dumps({"node_id": node_id, "checkpoint": checkpoint})
        assert keys.encode_route(node_id, entry_id) == expected


async def test_a_flush_updates_the_route_view_without_replacing_the_loaded_route(
    world: World,
) -> None:
    loaded = world.region_map.routes[3]
    world.report(3, 33, node_id=7)
    assert await world.checkpointer.flush() == 1
    route = world.region_map.route(3)
    assert route is not None
    assert (route.node_id, route.checkpoint_entry_id) == (7, 33)
    # The loaded object stays in the map (frozen out of the collector at leadership).
    assert world.region_map.routes[3] is loaded
    world.report(3, 33, node_id=7)
    assert await world.checkpointer.flush() == 0  # unchanged: compared with the written one
