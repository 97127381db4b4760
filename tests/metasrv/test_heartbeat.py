"""Heartbeat ingest: per-region rejections, whole-body validation, what gets stored.

The topic-region map comes from a real SQL kv backend (SQLite in memory), loaded by
`Topology.load()`; Kafka is never contacted because no region is registered here.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from metasrv import keys
from metasrv.checkpoints import Checkpointer
from metasrv.errors import InvalidArgument
from metasrv.heartbeat import HeartbeatHandler
from metasrv.kafka import KafkaAdmin
from metasrv.kv import SqlKv
from metasrv.locks import TopicLocks
from metasrv.mailbox import Mailbox
from metasrv.metrics import Metrics
from metasrv.model import RegionStat
from metasrv.registry import RegionRegistry
from metasrv.settings import load_settings
from metasrv.topology import Topology, route_value


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Setup:
    def __init__(self, kv: SqlKv, kafka_bootstrap: str) -> None:
        self.settings = load_settings(
            None, wal={"broker_endpoints": [kafka_bootstrap], "checkpoint_batch": 1000}
        )
        self.kv = kv
        self.kafka = KafkaAdmin(kafka_bootstrap)
        self.registry = RegionRegistry()
        self.metrics = Metrics()
        self.topology = Topology(kv, self.kafka, TopicLocks(), self.settings)
        self.mailbox = Mailbox(self.registry, metrics=self.metrics)
        self.checkpointer = Checkpointer(self.topology, self.registry, self.settings, self.metrics)
        self.topology.removal_listeners.append(
            lambda r: self.registry.discard(r.region_id, r.topic)
        )
        self.clock = Clock()
        self.misrouted: list[RegionStat] = []
        self.handler = HeartbeatHandler(
            self.registry,
            self.topology,
            self.mailbox,
            self.checkpointer,
            self.metrics,
            leader_addr=lambda: "leader:4000",
            clock=self.clock,
            on_misrouted=self.misrouted.extend,
        )

    def beat(self, regions: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        body = {"node_id": 1, "addr": "dn1:4001", "regions": regions, **extra}
        result: dict[str, Any] = orjson.loads(self.handler.handle(orjson.dumps(body)))
        return result


def region(
    region_id: int,
    flushed: int,
    *,
    topic: str = "t_0",
    latest: int | None = None,
    memtable: int = 100,
    manifest: int | None = 1,
) -> dict[str, Any]:
    return {
        "region_id": region_id,
        "topic": topic,
        "flushed_entry_id": flushed,
        "topic_latest_entry_id": latest,
        "memtable_bytes": memtable,
        "manifest_version": manifest,
    }


@pytest.fixture
async def hb(kafka_bootstrap: str) -> Any:
    kv = SqlKv.open("sqlite://", create=True)
    kv.batch_put(
        [
            (keys.topic_region("t_0", 1), route_value(1, None)),
            (keys.topic_region("t_0", 2), route_value(1, None)),
            (keys.topic_region("t_1", 3), route_value(1, 7)),
        ]
    )
    setup = Setup(kv, kafka_bootstrap)
    await setup.topology.load()
    yield setup
    kv.close()


def rejected(resp: dict[str, Any]) -> dict[int, str]:
    return {r["region_id"]: r["reason"] for r in resp["rejected"]}


async def test_valid_heartbeat_is_stored(hb: Setup) -> None:
    resp = hb.beat(
        [region(1, 10), region(3, 4, topic="t_1", latest=9, memtable=0)],
        topics=[{"topic": "t_0", "latest_entry_id": 20, "record_size": 2000, "record_num": 20}],
    )
    assert resp == {"leader": "leader:4000", "instructions": [], "rejected": []}
    stat = hb.registry.get(1)
    assert stat == RegionStat(1, 1, "t_0", 10, None, 100, 1, 50.0)
    stat3 = hb.registry.get(3)
    assert stat3 is not None and stat3.prunable_entry_id == 9
    topic = hb.registry.topic_stat("t_0")
    assert topic is not None and topic.latest_entry_id == 20
    assert hb.registry.nodes()[1].addr == "dn1:4001"
    assert hb.metrics.heartbeats._value.get() == 1
    assert hb.metrics.region_stats._value.get() == 2


async def test_each_rejection_reason_and_nothing_stored_for_rejected(hb: Setup) -> None:
    hb.beat([region(2, 50, manifest=3)])
    resp = hb.beat(
        [
            region(1, 10),  # accepted
            region(99, 10),  # unknown_region
            region(3, 10, topic="t_0"),  # topic_mismatch (mapped to t_1)
            region(-5, 10),  # negative_id
            region(2, 40, manifest=3),  # stat_regressed (same manifest version)
        ]
    )
    assert rejected(resp) == {
        99: "unknown_region",
        3: "topic_mismatch",
        -5: "negative_id",
        2: "stat_regressed",
    }
    assert hb.registry.get(1) is not None
    assert hb.registry.get(99) is None
    assert hb.registry.get(3) is None
    stat2 = hb.registry.get(2)
    assert stat2 is not None and stat2.flushed_entry_id == 50
    counts = {
        reason: hb.metrics.region_stats_rejected.labels(reason)._value.get()
        for reason in ("unknown_region", "topic_mismatch", "negative_id", "stat_regressed")
    }
    assert counts == {
        "unknown_region": 1,
        "topic_mismatch": 1,
        "negative_id": 1,
        "stat_regressed": 1,
    }


@pytest.mark.parametrize(
    "bad",
    [
        region(1, -2),  # flushed below -1
        region(1, 5, latest=-2),  # topic latest below -1
    ],
)
async def test_entry_ids_below_minus_one_are_negative_id(hb: Setup, bad: dict[str, Any]) -> None:
    resp = hb.beat([bad])
    assert rejected(resp) == {1: "negative_id"}
    assert hb.registry.get(1) is None


async def test_minus_one_means_nothing_flushed_and_is_accepted(hb: Setup) -> None:
    assert hb.beat([region(1, -1, latest=-1)])["rejected"] == []
    stat = hb.registry.get(1)
    assert stat is not None and stat.prunable_entry_id == -1


@pytest.mark.parametrize(
    ("old_manifest", "new_manifest", "reason"),
    [
        (3, 3, "stat_regressed"),
        (3, 4, "stat_regressed"),  # newer manifest, lower flushed: still backwards
        (None, 4, "stat_regressed"),
        (3, None, "stat_regressed"),  # cannot be ordered: keep the monotonic rule
        (4, 3, None),  # lower manifest version: region re-created, lower id is the truth
    ],
)
async def test_stat_regression_rule(
    hb: Setup, old_manifest: int | None, new_manifest: int | None, reason: str | None
) -> None:
    hb.beat([region(1, 50, manifest=old_manifest)])
    resp = hb.beat([region(1, 40, manifest=new_manifest)])
    stat = hb.registry.get(1)
    assert stat is not None
    if reason is None:
        assert resp["rejected"] == []
        assert stat.flushed_entry_id == 40
    else:
        assert rejected(resp) == {1: reason}
        assert stat.flushed_entry_id == 50


async def test_same_or_higher_flushed_and_dropping_topic_latest_are_accepted(hb: Setup) -> None:
    hb.beat([region(1, 50, latest=90, memtable=0)])
    # Memtable no longer empty: prunable drops from 90 to 50; that is not a regression.
    assert hb.beat([region(1, 50, latest=None)])["rejected"] == []
    stat = hb.registry.get(1)
    assert stat is not None and stat.prunable_entry_id == 50


BAD_BODIES: list[tuple[str, Any]] = [
    ("not json", b"{nope"),
    ("array", []),
    ("no node_id", {"regions": []}),
    ("bool node_id", {"node_id": True, "regions": []}),
    ("negative node_id", {"node_id": -1, "regions": []}),
    ("string node_id", {"node_id": "1", "regions": []}),
    ("addr not str", {"node_id": 1, "addr": 5, "regions": []}),
    ("regions missing", {"node_id": 1}),
    ("regions not list", {"node_id": 1, "regions": {}}),
    ("region not object", {"node_id": 1, "regions": [5]}),
    (
        "missing flushed",
        {"node_id": 1, "regions": [{"region_id": 1, "topic": "t_0", "memtable_bytes": 1}]},
    ),
    ("float id", {"node_id": 1, "regions": [{**region(1, 1), "region_id": 1.0}]}),
    ("string flushed", {"node_id": 1, "regions": [{**region(1, 1), "flushed_entry_id": "1"}]}),
    ("topic not str", {"node_id": 1, "regions": [{**region(1, 1), "topic": 0}]}),
    ("negative memtable", {"node_id": 1, "regions": [region(1, 1, memtable=-1)]}),
    ("negative manifest", {"node_id": 1, "regions": [region(1, 1, manifest=-1)]}),
    ("bool latest", {"node_id": 1, "regions": [{**region(1, 1), "topic_latest_entry_id": False}]}),
    ("topics not list", {"node_id": 1, "regions": [], "topics": "t"}),
    ("topic report bad", {"node_id": 1, "regions": [], "topics": [{"topic": "t_0"}]}),
    (
        "topic report negative",
        {
            "node_id": 1,
            "regions": [],
            "topics": [{"topic": "t", "latest_entry_id": 1, "record_size": -1, "record_num": 0}],
        },
    ),
]


BAD_BODIES += [
    # The decoder raises these as UnicodeDecodeError / RecursionError, not DecodeError: they
    # once escaped as 500s (issue #15).
    ("invalid_utf8_in_string", b'{"node_id":1,"addr":"\xc3\x28","regions":[]}'),
    (
        "nested_past_the_parsers_limit",
        b'{"node_id":1,"regions":[],"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ),
]


@pytest.mark.parametrize(("name", "body"), BAD_BODIES, ids=[n for n, _ in BAD_BODIES])
async def test_malformed_heartbeat_is_invalid_and_stores_nothing(
    hb: Setup, name: str, body: Any
) -> None:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    if isinstance(body, dict) and isinstance(body.get("regions"), list):
        # A valid region ahead of the bad part must not be stored either.
        body["regions"].insert(0, region(2, 5))
        raw = orjson.dumps(body)
    with pytest.raises(InvalidArgument):
        hb.handler.handle(raw)
    assert hb.registry.get(2) is None
    assert hb.registry.topic_stats() == {}
    assert hb.checkpointer.dirty_count == 0
    assert hb.metrics.heartbeats._value.get() == 0


async def test_validation_error_names_the_field(hb: Setup) -> None:
    body = {"node_id": 1, "regions": [region(1, 1), {**region(2, 1), "flushed_entry_id": "x"}]}
    with pytest.raises(InvalidArgument) as info:
        hb.handler.handle(orjson.dumps(body))
    assert info.value.details["errors"][0]["loc"] == ["body", "regions", 1, "flushed_entry_id"]


async def test_only_changed_prunable_ids_are_marked_for_checkpoint(hb: Setup) -> None:
    hb.beat([region(1, 10), region(2, 20)])
    assert hb.checkpointer.dirty_count == 2
    hb.checkpointer.clear()
    hb.clock.now += 1
    hb.beat([region(1, 10), region(2, 20, memtable=5)])  # same prunable ids
    assert hb.checkpointer.dirty_count == 0
    hb.beat([region(1, 11), region(2, 20)])
    assert hb.checkpointer.dirty_count == 1


async def test_instructions_ride_responses_until_applied(hb: Setup) -> None:
    hb.beat([region(1, 10)])
    iid = hb.mailbox.send_flush(1, [1], ttl=30)
    resp = hb.beat([region(1, 10)])
    assert resp["instructions"] == [{"id": iid, "kind": "flush_regions", "region_ids": [1]}]
    # The flush shows up in this heartbeat: applied, so no longer listed.
    resp = hb.beat([region(1, 12)])
    assert resp["instructions"] == []
    assert hb.mailbox.state(iid) == "applied"


async def test_rejected_region_does_not_apply_an_instruction(hb: Setup) -> None:
    hb.beat([region(1, 10)])
    iid = hb.mailbox.send_flush(1, [1], ttl=30)
    hb.beat([region(1, 12, topic="t_1")])  # topic_mismatch: not stored, not observed
    assert hb.mailbox.state(iid) == "pending"


async def test_removed_region_is_unknown_again_although_it_had_a_stat(hb: Setup) -> None:
    # Steady-state heartbeats take the mapped topic from the stored row; removing the
    # region from the map must drop that row, or its reports would still be accepted.
    assert hb.beat([region(1, 10)])["rejected"] == []
    await hb.topology.deregister(1)
    assert hb.registry.get(1) is None
    assert rejected(hb.beat([region(1, 11)])) == {1: "unknown_region"}
    assert hb.registry.get(1) is None


async def test_big_heartbeat_round_trip(kafka_bootstrap: str) -> None:
    # Guards the hot loop against per-region state leaking between iterations.
    kv = SqlKv.open("sqlite://", create=True)
    try:
        kv.batch_put(
            [(keys.topic_region(f"t_{i % 4}", i), route_value(1, None)) for i in range(2000)]
        )
        setup = Setup(kv, kafka_bootstrap)
        await setup.topology.load()
        resp = setup.beat(
            [region(i, i, topic=f"t_{i % 4}") for i in range(2000)] + [region(5000, 1)]
        )
        assert rejected(resp) == {5000: "unknown_region"}
        assert len(setup.registry) == 2000
        for i in range(2000):
            stat = setup.registry.get(i)
            assert stat is not None and stat.flushed_entry_id == i and stat.topic == f"t_{i % 4}"
    finally:
        kv.close()


async def test_unmapped_and_misrouted_reports_go_to_the_stat_history_hook(hb: Setup) -> None:
    resp = hb.beat([region(1, 10), region(99, 5), region(3, 4, topic="t_0")])
    assert rejected(resp) == {99: "unknown_region", 3: "topic_mismatch"}
    assert [(s.region_id, s.topic, s.flushed_entry_id) for s in hb.misrouted] == [
        (99, "t_0", 5),
        (3, "t_0", 4),
    ]
    assert hb.registry.get(99) is None


# Decoding edge cases: the body is decoded by msgspec, and a body it refuses is checked
# again field by field; the answers must be the ones the field checks give.
WIDE_ERRORS: list[tuple[str, bytes, list[Any]]] = [
    (
        "bool id",
        b'{"node_id":1,"regions":[{"region_id":true,"topic":"t_0","flushed_entry_id":1,'
        b'"memtable_bytes":0}]}',
        ["regions", 0, "region_id"],
    ),
    (
        "float flushed",
        b'{"node_id":1,"regions":[{"region_id":1,"topic":"t_0","flushed_entry_id":5.0,'
        b'"memtable_bytes":0}]}',
        ["regions", 0, "flushed_entry_id"],
    ),
    (
        "exponent memtable",
        b'{"node_id":1,"regions":[{"region_id":1,"topic":"t_0","flushed_entry_id":5,'
        b'"memtable_bytes":1e3}]}',
        ["regions", 0, "memtable_bytes"],
    ),
    (
        "id wider than u64",
        b'{"node_id":1,"regions":[{"region_id":18446744073709551616,"topic":"t_0",'
        b'"flushed_entry_id":5,"memtable_bytes":0}]}',
        ["regions", 0, "region_id"],
    ),
    (
        "flushed below i64",
        b'{"node_id":1,"regions":[{"region_id":1,"topic":"t_0",'
        b'"flushed_entry_id":-9223372036854775809,"memtable_bytes":0}]}',
        ["regions", 0, "flushed_entry_id"],
    ),
    (
        "bool manifest",
        b'{"node_id":1,"regions":[{"region_id":1,"topic":"t_0","flushed_entry_id":5,'
        b'"memtable_bytes":0,"manifest_version":true}]}',
        ["regions", 0, "manifest_version"],
    ),
    ("node_id wider than u64", b'{"node_id":18446744073709551616,"regions":[]}', ["node_id"]),
    ("float node_id", b'{"node_id":1.5,"regions":[]}', ["node_id"]),
    (
        "bool record_num",
        b'{"node_id":1,"regions":[],"topics":[{"topic":"t_0","latest_entry_id":1,'
        b'"record_size":1,"record_num":false}]}',
        ["topics", 0, "record_num"],
    ),
    (
        "empty topic in report",
        b'{"node_id":1,"regions":[],"topics":[{"topic":"","latest_entry_id":1,'
        b'"record_size":1,"record_num":1}]}',
        ["topics", 0, "topic"],
    ),
    (
        "second region bad, first good",
        b'{"node_id":1,"regions":[{"region_id":1,"topic":"t_0","flushed_entry_id":5,'
        b'"memtable_bytes":0},{"region_id":2,"topic":null,"flushed_entry_id":5,'
        b'"memtable_bytes":0}]}',
        ["regions", 1, "topic"],
    ),
]


@pytest.mark.parametrize(("name", "body", "loc"), WIDE_ERRORS, ids=[n for n, _, _ in WIDE_ERRORS])
async def test_decoding_edge_cases_are_422_with_the_field(
    hb: Setup, name: str, body: bytes, loc: list[Any]
) -> None:
    with pytest.raises(InvalidArgument) as info:
        hb.handler.handle(body)
    assert info.value.details["errors"][0]["loc"] == ["body", *loc]
    assert hb.registry.get(1) is None
    assert hb.metrics.heartbeats._value.get() == 0


async def test_u64_values_above_i64_are_accepted_as_before(hb: Setup) -> None:
    # orjson always parsed [2**63, 2**64) as integers; the decoder's int64 bounds send such
    # a body to the field checks, which accept it.
    big = 2**64 - 1
    resp = hb.beat(
        [region(1, 2**63), region(big, 5), region(2, 7, memtable=big, manifest=2**63)],
        topics=[{"topic": "t_0", "latest_entry_id": big, "record_size": big, "record_num": 1}],
    )
    assert rejected(resp) == {big: "unknown_region"}
    stat1, stat2 = hb.registry.get(1), hb.registry.get(2)
    assert stat1 is not None and stat1.flushed_entry_id == 2**63
    assert stat2 is not None and stat2.memtable_bytes == big and stat2.manifest_version == 2**63
    topic = hb.registry.topic_stat("t_0")
    assert topic is not None and topic.latest_entry_id == big
    assert [s.region_id for s in hb.misrouted] == [big]


async def test_unknown_fields_are_ignored_and_optional_fields_may_be_null_or_absent(
    hb: Setup,
) -> None:
    body = (
        b'{"node_id":1,"future":{"x":[1,2.5,null]},"addr":null,"topics":null,"regions":['
        b'{"region_id":1,"topic":"t_0","flushed_entry_id":5,"memtable_bytes":0,"extra":"y"},'
        b'{"region_id":2,"topic":"t_0","flushed_entry_id":6,"memtable_bytes":0,'
        b'"topic_latest_entry_id":null,"manifest_version":null}]}'
    )
    assert orjson.loads(hb.handler.handle(body))["rejected"] == []
    stat1, stat2 = hb.registry.get(1), hb.registry.get(2)
    assert stat1 is not None and stat1.topic_latest_entry_id is None
    assert stat1.manifest_version is None and stat1.flushed_entry_id == 5
    assert stat2 is not None and stat2.flushed_entry_id == 6
    assert hb.registry.nodes()[1].addr is None


async def test_deep_nesting_inside_an_unknown_field_is_ignored_like_the_field(hb: Setup) -> None:
    """1,000 levels: too deep for the fast decoder, parsed by the checked path, whose
    answer is the usual one for an unknown field (ignored)."""
    raw = b'{"node_id":1,"regions":[],"x":' + b"[" * 1000 + b"]" * 1000 + b"}"
    assert orjson.loads(hb.handler.handle(raw))["rejected"] == []
