"""A follower applies the kv the way a cold load reads it, on real etcd, PostgreSQL and
SQLite: after stale and odd writes (a deposed leader's late checkpoint of a moved region,
a region's key under a second topic, a damaged value, a malformed key) the warm map is
exactly the map a full load of the same kv gives."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.kv import Delete, KvBackend
from metasrv.leader import MapFollower, TopicLocks, TopicRegionMap
from metasrv.model import RegionRoute
from metasrv.settings import Settings, load_settings
from tests._wait import eventually
from tests.metasrv.kv.conftest import KvFactory

T0, T1, T2, T3 = "fa_0", "fa_1", "fa_2", "fa_3"
LOWER = "ea_0"
"""A topic that sorts before `T0`."""


@dataclass
class World:
    store: KvBackend
    """The kv as leaders (and anything else) write it."""
    region_map: TopicRegionMap
    follower: MapFollower
    settings: Settings
    kafka: KafkaAdmin

    def put(self, topic: str, region_id: int, value: bytes) -> int:
        return self.store.put(keys.topic_region(topic, region_id), value)

    def delete(self, topic: str, region_id: int) -> int:
        return self.store.txn([], [Delete(keys.topic_region(topic, region_id))]).revision

    async def caught_up(self, revision: int) -> None:
        await eventually(
            lambda: self.region_map.revision >= revision, f"the follower at revision {revision}"
        )

    async def cold(self) -> TopicRegionMap:
        cold = TopicRegionMap(self.store, self.kafka, TopicLocks(), self.settings)
        await cold.load()
        return cold


def _view(m: TopicRegionMap) -> tuple[dict[int, RegionRoute | None], dict[str, list[int]], int]:
    """What a map serves: each region's route, each topic's regions, the keys it holds."""
    by_topic = {t: sorted(regions) for t, regions in m.routes_by_topic().items()}
    routes = {r: m.route(r) for r in sorted(m.routes)}
    return routes, by_topic, m.holds_after([])


@pytest.fixture
async def world(kv_store: KvFactory, kafka_bootstrap: str) -> AsyncIterator[World]:
    settings = load_settings(None, wal={"broker_endpoints": [kafka_bootstrap]})
    kafka = KafkaAdmin(kafka_bootstrap)
    writer, reader = kv_store("fa/"), kv_store("fa/")
    writer.batch_put([(keys.topic_region(T0, r), keys.encode_route(1, None)) for r in range(1, 7)])
    region_map = TopicRegionMap(reader, kafka, TopicLocks(), settings)
    follower = MapFollower(region_map, reader)
    follower.start()
    await eventually(lambda: follower.warm, "the follower warm")
    yield World(writer, region_map, follower, settings, kafka)
    await follower.stop()


async def test_stale_and_odd_puts_leave_the_follower_with_the_cold_loads_map(
    world: World,
) -> None:
    # The next leader moves region 3 from T0 to T1 (a delete, then a registration).
    world.delete(T0, 3)
    await world.caught_up(world.put(T1, 3, keys.encode_route(2, None)))
    reloads = world.follower.reloads

    # Then writes only, none of them a registration metasrv would make: a deposed
    # leader's late checkpoint recreating T0/3; region 4's key under a second topic,
    # region 5's under a topic that sorts first; a checkpoint; a damaged value; a key
    # that is no route.
    world.put(T0, 3, keys.encode_route(1, 50))
    world.put(T2, 4, keys.encode_route(1, None))
    world.put(LOWER, 5, keys.encode_route(3, 9))
    world.put(T0, 1, keys.encode_route(1, 77))
    world.put(T0, 2, b"not json")
    world.store.put(f"{keys.TOPIC_REGION_PREFIX}{T0}/not-a-region", b"{}")
    await world.caught_up(world.put(T3, 6, keys.encode_route(1, 5)))

    assert world.follower.reloads == reloads  # applied change by change, not reloaded
    warm, cold = _view(world.region_map), _view(await world.cold())
    assert warm == cold
    routes, by_topic, _ = warm
    assert by_topic[T0] == [1, 2, 3, 4, 5, 6] and by_topic[T1] == [3]  # 3 under both
    assert by_topic[LOWER] == [5] and by_topic[T2] == [4]
    assert routes[5] == RegionRoute(5, LOWER, 3, 9)
    assert routes[1] == RegionRoute(1, T0, 1, 77)
    # A stat table is prepared with each region once, under its route's topic.
    routed = world.region_map.routed_by_topic()
    placed = sorted((r, t) for t, mapped in routed.items() for r in mapped)
    assert placed == [(r, route.topic) for r, route in routes.items() if route is not None]

    # Deleting the key a doubled region's route comes from leaves it on the other one.
    world.delete(LOWER, 5)
    await world.caught_up(world.delete(T0, 6))
    assert await world.follower.take_over(lambda: True)
    warm, cold = _view(world.region_map), _view(await world.cold())
    assert warm == cold
    routes, by_topic, _ = warm
    assert routes[5] == RegionRoute(5, T0, 1, None) and routes[6] == RegionRoute(6, T3, 1, 5)
