"""Topic-region map on real etcd and Kafka: registration, assignment, removal, reload."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from metasrv import keys
from metasrv.errors import Conflict, InvalidArgument, LeadershipLost, NotFound
from metasrv.kafka import KafkaAdmin
from metasrv.kv import Compare, EtcdKv
from metasrv.leader import TopicLocks, TopicRegionMap
from metasrv.settings import Settings, load_settings
from tests._wait import eventually


class World:
    def __init__(self, kv: EtcdKv, kafka: KafkaAdmin, settings: Settings) -> None:
        self.kv = kv
        self.kafka = kafka
        self.settings = settings
        self.locks = TopicLocks()
        self.region_map = TopicRegionMap(kv, kafka, self.locks, settings)

    def fresh_topology(self) -> TopicRegionMap:
        return TopicRegionMap(self.kv, self.kafka, TopicLocks(), self.settings)


@pytest.fixture
async def world(
    etcd_endpoint: str, kafka_bootstrap: str, unique_prefix: str
) -> AsyncIterator[World]:
    settings = load_settings(
        None,
        wal={
            "broker_endpoints": [kafka_bootstrap],
            "num_topics": 3,
            "topic_name_prefix": f"{unique_prefix}_wal",
        },
    )
    kv = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
    kafka = KafkaAdmin(kafka_bootstrap)
    w = World(kv, kafka, settings)
    await w.region_map.load()
    yield w
    kafka.delete_topics(t for t in kafka.list_topics() if t.startswith(unique_prefix))
    kv.delete_prefix("")
    kv.close()


async def test_pool_topics_and_topics(world: World, unique_prefix: str) -> None:
    pool = [f"{unique_prefix}_wal_{n}" for n in range(3)]
    assert world.region_map.pool_topics() == pool
    assert world.region_map.topics() == pool
    await world.region_map.register(7, 1, topic=f"{unique_prefix}_custom")
    assert world.region_map.topics() == [*pool, f"{unique_prefix}_custom"]


async def test_register_creates_kafka_topic_and_writes_route(world: World) -> None:
    pool = world.region_map.pool_topics()
    assert pool[0] not in world.kafka.list_topics()
    route = await world.region_map.register(1 << 32 | 1, 4)
    assert route.topic == pool[0]
    assert route.node_id == 4 and route.checkpoint_entry_id is None
    assert pool[0] in world.kafka.list_topics()
    stored = world.kv.get(keys.topic_region(pool[0], 1 << 32 | 1))
    assert stored is not None
    assert orjson.loads(stored.value) == {"node_id": 4, "checkpoint": None}
    assert world.region_map.route(1 << 32 | 1) == route
    assert world.region_map.regions_of(pool[0]) == [route]


async def test_least_loaded_assignment(world: World) -> None:
    pool = world.region_map.pool_topics()
    await world.region_map.register(100, 1, topic=pool[0])
    await world.region_map.register(101, 1, topic=pool[0])
    await world.region_map.register(102, 1, topic=pool[1])
    # Loads are 2, 1, 0: the next goes to pool[2], then pool[1] and pool[2] tie -> pool[1].
    assert (await world.region_map.register(1, 1)).topic == pool[2]
    assert (await world.region_map.register(2, 1)).topic == pool[1]
    assert (await world.region_map.register(3, 1)).topic == pool[2]
    counts = [world.region_map.region_count(t) for t in pool]
    assert counts == [2, 2, 2]


async def test_concurrent_registrations_spread_over_the_pool(world: World) -> None:
    await asyncio.gather(*(world.region_map.register(i, 1) for i in range(6)))
    assert [world.region_map.region_count(t) for t in world.region_map.pool_topics()] == [2, 2, 2]


async def test_register_is_idempotent_and_conflicts_on_another_topic(world: World) -> None:
    pool = world.region_map.pool_topics()
    first = await world.region_map.register(9, 1, topic=pool[1])
    assert await world.region_map.register(9, 1) == first
    assert await world.region_map.register(9, 1, topic=pool[1]) == first
    with pytest.raises(Conflict):
        await world.region_map.register(9, 1, topic=pool[2])
    assert world.kv.get(keys.topic_region(pool[2], 9)) is None


@pytest.mark.parametrize(
    ("region_id", "node_id", "topic"),
    [(-1, 1, None), (1 << 64, 1, None), (1, -1, None), (1, 1, "bad topic!"), (1, 1, "")],
)
async def test_register_rejects_bad_arguments(
    world: World, region_id: int, node_id: int, topic: str | None
) -> None:
    with pytest.raises(InvalidArgument):
        await world.region_map.register(region_id, node_id, topic)
    assert len(world.region_map) == 0


async def test_deregister(world: World) -> None:
    route = await world.region_map.register(5, 1)
    seen: list[int] = []
    world.region_map.removal_listeners.append(lambda r: seen.append(r.region_id))
    removed = await world.region_map.deregister(5)
    assert removed == route
    assert seen == [5]
    assert world.region_map.route(5) is None
    assert world.kv.get(keys.topic_region(route.topic, 5)) is None
    with pytest.raises(NotFound):
        await world.region_map.deregister(5)


async def test_load_round_trip_and_damaged_values_stay_mapped(world: World) -> None:
    pool = world.region_map.pool_topics()
    await world.region_map.register(1, 3, topic=pool[0])
    await world.region_map.register(2, 4, topic=pool[1])
    await world.region_map.set_checkpoints({1: (3, 42)})
    world.kv.put(keys.topic_region(pool[2], 3), b"not json")
    fresh = world.fresh_topology()
    assert await fresh.load() == 3
    r1, r2, r3 = fresh.route(1), fresh.route(2), fresh.route(3)
    assert r1 is not None and (r1.topic, r1.node_id, r1.checkpoint_entry_id) == (pool[0], 3, 42)
    assert r2 is not None and (r2.topic, r2.node_id, r2.checkpoint_entry_id) == (pool[1], 4, None)
    # A damaged value must not unmap the region: a purge would then ignore it.
    assert r3 is not None and r3.topic == pool[2] and r3.checkpoint_entry_id is None


async def test_set_checkpoints_skips_unchanged_and_unmapped(world: World) -> None:
    pool = world.region_map.pool_topics()
    await world.region_map.register(1, 3, topic=pool[0])
    key = keys.topic_region(pool[0], 1)
    assert await world.region_map.set_checkpoints({1: (3, 10), 77: (3, 5)}) == 1
    first = world.kv.get(key)
    assert first is not None
    assert orjson.loads(first.value) == {"node_id": 3, "checkpoint": {"entry_id": 10}}
    assert await world.region_map.set_checkpoints({1: (3, 10)}) == 0
    again = world.kv.get(key)
    assert again is not None and again.mod_revision == first.mod_revision
    assert world.kv.get(keys.topic_region(pool[0], 77)) is None
    assert await world.region_map.set_checkpoints({1: (5, 10)}) == 1  # node changed
    route = world.region_map.route(1)
    assert route is not None and route.node_id == 5


async def test_pruned_entry_ids(world: World) -> None:
    pool = world.region_map.pool_topics()
    world.kv.put(keys.topic_name(pool[0]), b'{"pruned_entry_id": 120}')
    world.kv.put(keys.topic_name(pool[1]), b'{"pruned_entry_id": null}')
    assert await world.region_map.pruned_entry_ids() == {pool[0]: 120, pool[1]: None}
    assert await world.region_map.pruned_entry_id(pool[0]) == 120
    assert await world.region_map.pruned_entry_id(pool[2]) is None


async def test_writes_carry_the_fence(world: World) -> None:
    # A fence that does not hold (another leader's term) makes writes fail in the store.
    world.region_map.fence = lambda: [Compare(keys.ELECTION_KEY, value=b"someone-else")]
    with pytest.raises(LeadershipLost):
        await world.region_map.register(11, 1)
    assert world.region_map.route(11) is None
    assert world.kv.range(keys.TOPIC_REGION_PREFIX) == []


async def test_registration_waits_for_a_purge_holding_the_topic(world: World) -> None:
    pool = world.region_map.pool_topics()
    await world.region_map.register(1, 1, topic=pool[0])  # topic exists now
    async with world.locks.write(pool[0]):
        task = asyncio.create_task(world.region_map.register(2, 1, topic=pool[0]))
        await eventually(
            lambda: world.locks._locks[pool[0]].users == 2, "the registration queued on the lock"
        )
        assert not task.done()
        assert world.region_map.route(2) is None
    route = await asyncio.wait_for(task, 10)
    assert route.topic == pool[0]


def _topology_with(world: World, **wal: object) -> TopicRegionMap:
    """A topic-region map on the world's kv and Kafka whose `[wal]` differs by `wal`."""
    settings = world.settings.model_copy(update={"wal": world.settings.wal.model_copy(update=wal)})
    return TopicRegionMap(world.kv, world.kafka, TopicLocks(), settings)


async def test_create_pool_applies_topic_config(world: World) -> None:
    pool = world.region_map.pool_topics()
    topic_config = {"retention.ms": "3600000", "segment.bytes": "2097152"}
    region_map = _topology_with(world, topic_config=topic_config)
    assert sorted(await region_map.create_pool()) == pool
    configs = world.kafka.topic_configs(pool)
    for topic in pool:
        assert configs[topic]["retention.ms"] == "3600000"
        assert configs[topic]["segment.bytes"] == "2097152"
        assert configs[topic]["cleanup.policy"] == "delete"
    assert await region_map.create_pool() == []  # existing topics are fine


async def test_without_auto_create_a_missing_topic_is_refused(world: World) -> None:
    pool = world.region_map.pool_topics()
    region_map = _topology_with(world, auto_create_topics=False)
    await region_map.load()
    assert await region_map.create_pool() == []
    with pytest.raises(InvalidArgument, match="auto_create_topics is false"):
        await region_map.register(9, 1)
    assert region_map.route(9) is None
    assert not set(pool) & world.kafka.list_topics()
