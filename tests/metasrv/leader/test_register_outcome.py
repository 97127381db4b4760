"""A registration whose kv write had an unknown outcome is re-read, on real etcd, PostgreSQL
and SQLite: the write lands and its answer is lost (the store applies it, then the call
raises `KvUnavailable`), and a retry never maps the region on a second topic."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest

from metasrv import keys
from metasrv.errors import KvUnavailable
from metasrv.kafka import KafkaAdmin
from metasrv.kv import Compare, KeyValue, KvBackend, TxnOp, TxnResult
from metasrv.leader import TopicLocks, TopicRegionMap
from metasrv.model import ID_MAX
from metasrv.settings import Settings, load_settings
from tests.metasrv.kv.conftest import KvFactory


@dataclass
class World:
    kv: KvBackend
    """The leader's store: the real backend, its answers lost as a test says."""
    store: KvBackend
    """The same store, read directly."""
    region_map: TopicRegionMap
    settings: Settings
    kafka: KafkaAdmin

    @property
    def pool(self) -> list[str]:
        return self.region_map.pool_topics()

    def lose_next_route_answer(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The next transaction writing a route is applied, then answers `KvUnavailable`."""
        real = self.kv.txn

        def txn(
            compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()
        ) -> TxnResult:
            result = real(compares, success, failure)
            if any(op.key.startswith(keys.TOPIC_REGION_PREFIX) for op in success):
                monkeypatch.setattr(self.kv, "txn", real)
                raise KvUnavailable("etcd request timed out (injected: the answer was lost)")
            return result

        monkeypatch.setattr(self.kv, "txn", txn)

    def fail_next_read(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The next `get` fails (the store unreachable for a moment)."""
        real = self.kv.get

        def get(key: str) -> KeyValue | None:
            monkeypatch.setattr(self.kv, "get", real)
            raise KvUnavailable("kv unreachable (injected)")

        monkeypatch.setattr(self.kv, "get", get)

    def topics_of(self, region_id: int) -> list[str]:
        """Every topic the store maps `region_id` on."""
        return [t for t in self.pool if self.store.get(keys.topic_region(t, region_id)) is not None]


@pytest.fixture
async def world(
    kv_store: KvFactory, kafka_bootstrap: str, unique_prefix: str
) -> AsyncIterator[World]:
    settings = load_settings(
        None,
        wal={
            "broker_endpoints": [kafka_bootstrap],
            "num_topics": 2,
            "topic_name_prefix": f"{unique_prefix}_ro",
        },
    )
    kafka = KafkaAdmin(kafka_bootstrap)
    kv = kv_store("ro/")
    region_map = TopicRegionMap(kv, kafka, TopicLocks(), settings)
    await region_map.load()
    # The pool exists, as a leader makes it at the start of its term, and each topic's
    # marker records its Kafka id (a first registration on it does): a registration's
    # only kv reads are then the ones these tests inject faults into.
    await region_map.create_pool()
    for topic in region_map.pool_topics():
        await region_map.register(ID_MAX, 1, topic)
        await region_map.deregister(ID_MAX)
    yield World(kv, kv_store("ro/"), region_map, settings, kafka)
    kafka.delete_topics(t for t in kafka.list_topics() if t.startswith(unique_prefix))


async def test_a_registration_whose_answer_was_lost_is_read_back(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.lose_next_route_answer(monkeypatch)
    route = await world.region_map.register(7, 1)  # answered from the re-read
    assert route.topic == world.pool[0]
    assert world.region_map.topic_of(7) == world.pool[0]
    await world.region_map.register(8, 1)  # the map counts region 7: pool[1]
    assert world.region_map.topic_of(8) == world.pool[1]
    assert world.topics_of(7) == [world.pool[0]]


async def test_a_retry_after_an_unreadable_outcome_never_maps_a_second_topic(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The write lands, its answer is lost and the re-read fails too: the caller gets
    # the error; another region takes the least-loaded topic meanwhile; the retry
    # finds the first write and answers it.
    world.lose_next_route_answer(monkeypatch)
    world.fail_next_read(monkeypatch)
    with pytest.raises(KvUnavailable):
        await world.region_map.register(7, 1)
    await world.region_map.register(8, 1)
    route = await world.region_map.register(7, 1)
    assert route.topic == world.pool[0]
    assert world.topics_of(7) == [world.pool[0]]
    # What the leader serves is what a cold load of the store reads.
    cold = TopicRegionMap(world.store, world.kafka, TopicLocks(), world.settings)
    await cold.load()
    assert {r: cold.topic_of(r) for r in (7, 8)} == {
        r: world.region_map.topic_of(r) for r in (7, 8)
    }
