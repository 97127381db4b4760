"""The checkpointer's dirty set: a region is held once however often it changes, a region
without a row when the flush comes is skipped, and a new term's table starts clean."""

from __future__ import annotations

import orjson

from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.kv import SqlKv
from metasrv.leader import Checkpointer, RegionRegistry, TopicLocks, TopicRegionMap
from metasrv.metrics import Metrics
from metasrv.model import RegionStat
from metasrv.settings import load_settings
from tests._stats import report


async def test_a_region_is_held_once_and_one_without_a_row_is_skipped(
    kafka_bootstrap: str,
) -> None:
    kv = SqlKv.open("sqlite://", create=True)
    try:
        kv.put(keys.topic_name("t"), keys.encode_marker(keys.Marker(None, "id-t")))
        kv.batch_put([(keys.topic_region("t", r), keys.encode_route(1, None)) for r in (1, 2, 3)])
        settings = load_settings(None, wal={"broker_endpoints": [kafka_bootstrap]})
        region_map = TopicRegionMap(kv, KafkaAdmin(kafka_bootstrap), TopicLocks(), settings)
        await region_map.load()
        registry = RegionRegistry()
        checkpointer = Checkpointer(region_map, registry, settings, Metrics())
        report(registry, [RegionStat(r, 1, "t", 10 * r, None, 0, None, 1.0) for r in (1, 2, 3)])
        for _ in range(5):  # changed on every heartbeat between two flushes
            checkpointer.mark([1, 2])
        checkpointer.mark([2, 3])
        assert checkpointer.dirty_count == 3
        registry.discard(2)  # deregistered: nothing to write for it
        assert await checkpointer.flush() == 2 and checkpointer.dirty_count == 0
        written = {}
        for r in (1, 2, 3):
            stored = kv.get(keys.topic_region("t", r))
            assert stored is not None
            written[r] = orjson.loads(stored.value)["checkpoint"]
        assert written == {1: {"entry_id": 10}, 2: None, 3: {"entry_id": 30}}
        checkpointer.mark([1, 3])
        registry.clear()  # a new term's table: the old one's dirty rows are not its own
        assert checkpointer.dirty_count == 0 and await checkpointer.flush() == 0
    finally:
        kv.close()
