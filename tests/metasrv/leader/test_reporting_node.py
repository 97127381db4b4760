"""The reporting node is the route's (issue #34): after a region moves to another datanode
(registered again with its new node), its old datanode's stale reports are rejected as
`wrong_node`, on the JSON and the columns path, with the map in real etcd, PostgreSQL and
SQLite stores."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.kv import KvBackend, KvChange
from metasrv.leader import (
    Checkpointer,
    HeartbeatHandler,
    Mailbox,
    RegionRegistry,
    TopicLocks,
    TopicRegionMap,
)
from metasrv.metrics import Metrics
from metasrv.settings import load_settings
from metasrv.wire import encode_columns
from tests.metasrv.kv.conftest import KvFactory

TOPIC = "rn_0"


@dataclass
class World:
    store: KvBackend
    region_map: TopicRegionMap
    registry: RegionRegistry
    checkpointer: Checkpointer
    handler: HeartbeatHandler
    encoding: str

    def beat(self, node_id: int, regions: list[tuple[int, int, int | None, int]]) -> dict[int, str]:
        """A heartbeat of `(region_id, flushed, idle claim, memtable bytes)`; the regions
        rejected, with their reasons."""
        if self.encoding == "columns":
            rows: list[tuple[int, str, int, int | None, int, int | None]] = [
                (r, TOPIC, f, latest, mem, 1) for r, f, latest, mem in regions
            ]
            answer = self.handler.handle_columns(encode_columns(node_id, "dn:1", rows, None))
        else:
            body = {
                "node_id": node_id,
                "addr": "dn:1",
                "regions": [
                    {
                        "region_id": r,
                        "topic": TOPIC,
                        "flushed_entry_id": f,
                        "topic_latest_entry_id": latest,
                        "memtable_bytes": mem,
                        "manifest_version": 1,
                    }
                    for r, f, latest, mem in regions
                ],
                "topics": [],
            }
            answer = self.handler.handle(orjson.dumps(body))
        doc: dict[str, Any] = orjson.loads(answer)
        return {item["region_id"]: item["reason"] for item in doc["rejected"]}

    def row(self, region_id: int) -> tuple[int, int] | None:
        """(node, prunable entry id) of the region's stored stat."""
        stat = self.registry.get(region_id)
        return None if stat is None else (stat.node_id, stat.prunable_entry_id)

    def new_term(self) -> None:
        """What a new leader's view does: empty stats, a slot prepared per mapped region."""
        self.registry.clear()
        self.registry.prepare(self.region_map.routes_by_topic().items())


@pytest.fixture(params=["json", "columns"])
async def world(
    request: pytest.FixtureRequest, kv_store: KvFactory, kafka_bootstrap: str
) -> AsyncIterator[World]:
    settings = load_settings(
        None, wal={"broker_endpoints": [kafka_bootstrap], "checkpoint_interval": "1h"}
    )
    kv = kv_store("rn/")
    kv.batch_put([(keys.topic_region(TOPIC, r), keys.encode_route(1, None)) for r in (1, 2, 3)])
    registry, metrics = RegionRegistry(), Metrics()
    region_map = TopicRegionMap(kv, KafkaAdmin(kafka_bootstrap), TopicLocks(), settings)
    region_map.removal_listeners.append(lambda r: registry.discard(r.region_id, r.topic))
    await region_map.load()
    checkpointer = Checkpointer(region_map, registry, settings, metrics)
    handler = HeartbeatHandler(
        registry,
        region_map,
        Mailbox(registry, metrics=metrics),
        checkpointer,
        metrics,
        leader_addr=lambda: "leader:4000",
    )
    w = World(kv, region_map, registry, checkpointer, handler, request.param)
    w.new_term()
    yield w


STALE = [(1, 10, None, 100), (2, 10, 500, 0), (3, 10, None, 100)]
"""Datanode 1's heartbeat, region 2 with an idle claim at 500 (its memtable is empty)."""


async def test_a_moved_regions_old_datanode_is_not_trusted(world: World) -> None:
    assert world.beat(1, STALE) == {}
    assert world.beat(1, STALE) == {}  # the steady path: the slots recalled
    assert world.row(2) == (1, 500)

    await world.region_map.register(2, 2)  # region 2 moved to datanode 2

    assert world.row(2) is None  # what datanode 1 said of it is forgotten
    assert world.beat(1, STALE) == {2: "wrong_node"}  # stale: not stored
    assert world.row(2) is None and world.row(1) == (1, 10)
    assert world.beat(2, [(2, 12, None, 100)]) == {}
    assert world.beat(1, STALE) == {2: "wrong_node"}
    assert world.beat(1, STALE) == {2: "wrong_node"}  # every time, recalled or not
    assert world.row(2) == (2, 12)

    assert await world.checkpointer.flush() == 3
    stored = world.store.get(keys.topic_region(TOPIC, 2))
    assert stored is not None
    assert orjson.loads(stored.value) == {"node_id": 2, "checkpoint": {"entry_id": 12}}


async def test_a_new_terms_first_reports_from_the_old_datanode_are_not_trusted(
    world: World,
) -> None:
    # The previous leader moved region 2 to datanode 2; this leader loads the map.
    world.store.put(keys.topic_region(TOPIC, 2), keys.encode_route(2, 10))
    await world.region_map.load()
    world.new_term()  # the table expects regions 1 and 3 from datanode 1, 2 from 2

    assert world.beat(1, STALE) == {2: "wrong_node"}
    assert world.row(2) is None and world.row(3) == (1, 10)
    assert world.beat(2, [(2, 12, None, 100)]) == {}
    assert world.row(2) == (2, 12)


async def test_a_region_moved_while_the_map_is_followed_is_judged_by_its_new_node(
    world: World,
) -> None:
    # Another leader moves region 2 (as `register` writes it) while this map follows
    # the kv: applying the change forgets the old datanode's stat.
    assert world.beat(1, STALE) == {}
    key = keys.topic_region(TOPIC, 2)
    revision = world.store.put(key, keys.encode_route(2, 10))
    world.region_map.apply([KvChange(key, keys.encode_route(2, 10), revision)])
    assert world.row(2) is None
    assert world.beat(1, STALE) == {2: "wrong_node"}
    assert world.beat(2, [(2, 12, None, 100)]) == {}
