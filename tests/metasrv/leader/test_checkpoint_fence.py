"""Checkpoint writes are fenced (DESIGN §2 invariant 9), on real etcd, PostgreSQL and SQLite.

A flush writes slice after slice; a leader deposed between two of them (the election key
taken over by the next term while this process, paused, still believes it leads) writes
nothing more, and no slice recreates a route key deleted behind the leader's map.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from sqlalchemy import update

from metasrv import keys
from metasrv.election import EtcdElection, SqlElection
from metasrv.kafka import KafkaAdmin
from metasrv.keys import ELECTION_KEY
from metasrv.kv import Compare, EtcdKv, KvBackend, SqlKv
from metasrv.leader import Checkpointer, RegionRegistry, TopicLocks, TopicRegionMap
from metasrv.metrics import Metrics
from metasrv.model import RegionStat
from metasrv.settings import load_settings
from metasrv.sql import election_table
from tests._stats import report
from tests._wait import eventually, wait_until
from tests.metasrv.kv.conftest import KvFactory

TOPIC = "cpf_0"
OTHER = "cpf_1"
OUR_TERM = b'{"node": "old", "term": 1}'
NEXT_TERM = b'{"node": "new", "term": 2}'


@dataclass
class World:
    kv: KvBackend
    """The store as the old leader reaches it."""
    store: KvBackend
    """The same store, as the next leader (or an operator) writes it."""
    region_map: TopicRegionMap
    registry: RegionRegistry
    leading: bool = True
    checkpointer: Checkpointer = field(init=False)

    def report(self, region_id: int, flushed: int) -> None:
        stat = RegionStat(region_id, 1, TOPIC, flushed, None, 0, 1, 0.0)
        report(self.registry, [stat])
        self.checkpointer.mark([region_id])

    def checkpoint(self, region_id: int, topic: str = TOPIC) -> int | None:
        stored = self.store.get(keys.topic_region(topic, region_id))
        assert stored is not None, f"route {topic}/{region_id} is gone"
        cp = orjson.loads(stored.value)["checkpoint"]
        return None if cp is None else int(cp["entry_id"])

    def after_first_slice(
        self, action: Callable[[], None], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Run `action` once the flush's first kv write has returned: between two slices."""
        calls = 0
        for name in ("batch_put", "batch_update"):
            real = getattr(self.kv, name, None)
            if real is None:
                continue

            def hooked(*args: Any, _real: Any = real) -> Any:
                nonlocal calls
                result = _real(*args)
                calls += 1
                if calls == 1:
                    action()
                return result

            monkeypatch.setattr(self.kv, name, hooked)


@pytest.fixture
async def world(kv_store: KvFactory, kafka_bootstrap: str) -> AsyncIterator[World]:
    settings = load_settings(
        None, wal={"broker_endpoints": [kafka_bootstrap], "checkpoint_interval": "1h"}
    )
    kv, store = kv_store("cpf/"), kv_store("cpf/")
    store.put(ELECTION_KEY, OUR_TERM)
    store.batch_put(
        [(keys.topic_region(TOPIC, r), keys.encode_route(1, None)) for r in range(1, 11)]
    )

    def fence() -> Sequence[Compare]:
        return [Compare(ELECTION_KEY, value=OUR_TERM)]

    region_map = TopicRegionMap(
        kv, KafkaAdmin(kafka_bootstrap), TopicLocks(), settings, fence=fence
    )
    await region_map.load()
    registry = RegionRegistry()
    w = World(kv, store, region_map, registry)
    w.checkpointer = Checkpointer(
        region_map, registry, settings, Metrics(), may_write=lambda: w.leading, flush_slice=3
    )
    yield w


async def test_a_leader_deposed_mid_flush_writes_nothing_more(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The next leader takes the election key, deregisters region 8 and registers it on
    # another topic, all between two slices of this (paused, unaware) leader's flush.
    def next_term() -> None:
        world.store.put(ELECTION_KEY, NEXT_TERM)
        world.store.delete(keys.topic_region(TOPIC, 8))
        world.store.put(keys.topic_region(OTHER, 8), keys.encode_route(2, None))

    world.after_first_slice(next_term, monkeypatch)
    for region_id in range(1, 11):
        world.report(region_id, 100 + region_id)

    assert await world.checkpointer.flush() == 3

    assert [world.checkpoint(r) for r in (1, 2, 3)] == [101, 102, 103]  # before the take-over
    assert [world.checkpoint(r) for r in (4, 5, 6, 7, 9, 10)] == [None] * 6
    assert world.store.get(keys.topic_region(TOPIC, 8)) is None
    moved = world.store.get(keys.topic_region(OTHER, 8))
    assert moved is not None and moved.value == keys.encode_route(2, None)
    # The next cold load maps region 8 on its new topic only.
    fresh = TopicRegionMap(
        world.store, KafkaAdmin("127.0.0.1:1"), TopicLocks(), load_settings(None)
    )
    await fresh.load()
    assert fresh.topic_of(8) == OTHER and len(fresh) == 10


async def test_may_write_is_asked_before_every_slice(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stepped_down() -> None:
        world.leading = False  # the election noticed; the fence in the kv still holds

    world.after_first_slice(stepped_down, monkeypatch)
    for region_id in range(1, 11):
        world.report(region_id, 100 + region_id)

    assert await world.checkpointer.flush() == 3
    assert [world.checkpoint(r) for r in range(1, 11)] == [101, 102, 103] + [None] * 7


async def test_a_checkpoint_never_recreates_a_route_deleted_behind_the_leader(
    world: World,
) -> None:
    world.store.delete(keys.topic_region(TOPIC, 5))  # by hand, or by a tool
    for region_id in range(1, 11):
        world.report(region_id, 100 + region_id)

    assert await world.checkpointer.flush() == 9

    assert world.store.get(keys.topic_region(TOPIC, 5)) is None
    assert [world.checkpoint(r) for r in (1, 4, 6, 10)] == [101, 104, 106, 110]


@pytest.mark.parametrize("kv_store", ["etcd", "postgresql"], indirect=True)
async def test_a_leader_whose_lease_ran_out_mid_flush_writes_nothing_more(
    kv_store: KvFactory, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Real elections: leader A's lease runs out between two slices of its flush (as a
    # paused process's does) and B is elected; A, still believing it leads, goes on.
    settings = load_settings(
        None, wal={"broker_endpoints": [kafka_bootstrap], "checkpoint_interval": "1h"}
    )
    kv, store = kv_store("cpr/"), kv_store("cpr/")
    store.batch_put(
        [(keys.topic_region(TOPIC, r), keys.encode_route(1, None)) for r in range(1, 11)]
    )
    a, b = _election(kv, "a"), _election(kv, "b")
    try:
        await a.start()
        await eventually(lambda: a.is_leader, "A leads")
        await b.start()
        region_map = TopicRegionMap(
            kv, KafkaAdmin(kafka_bootstrap), TopicLocks(), settings, fence=a.fence
        )
        await region_map.load()
        registry = RegionRegistry()
        w = World(kv, store, region_map, registry)
        w.checkpointer = Checkpointer(
            region_map, registry, settings, Metrics(), may_write=lambda: True, flush_slice=3
        )

        def depose() -> None:  # on the flush's worker thread, between two slices
            _expire(store, a)
            wait_until(lambda: b.is_leader, "B elected")

        w.after_first_slice(depose, monkeypatch)
        for region_id in range(1, 11):
            w.report(region_id, 100 + region_id)

        assert await w.checkpointer.flush() == 3

        assert [w.checkpoint(r) for r in range(1, 11)] == [101, 102, 103] + [None] * 7
        held = store.get(ELECTION_KEY)
        assert held is not None and b'"b"' in held.value
    finally:
        await a.stop()
        await b.stop()


def _election(kv: KvBackend, name: str) -> EtcdElection | SqlElection:
    if isinstance(kv, EtcdKv):
        own = EtcdKv(kv.endpoints, kv.key_prefix)
        return EtcdElection(own, node_name=name, addr=f"{name}:4000", lease_secs=2)
    assert isinstance(kv, SqlKv)
    return SqlElection(kv.url, kv.key_prefix, node_name=name, addr=f"{name}:4000", lease_secs=2)


def _expire(store: KvBackend, leader: EtcdElection | SqlElection) -> None:
    """End `leader`'s lease in the store, as time does to a paused leader's."""
    if isinstance(store, EtcdKv):
        store.client.revoke_lease(leader.term)
        return
    assert isinstance(store, SqlKv)
    with store.engine.begin() as conn:
        conn.execute(update(election_table).values(expires_at=0.0))
