"""Heartbeat ingest: per-region rejections, whole-body validation, what gets stored.

The topic-region map comes from a real SQL kv backend (SQLite in memory), loaded by
`TopicRegionMap.load()`; Kafka is never contacted: regions are registered only on topics
the map loaded, whose markers record a Kafka topic id already.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import orjson
import pytest

from metasrv import keys
from metasrv.errors import InvalidArgument
from metasrv.kafka import KafkaAdmin
from metasrv.kv import SqlKv
from metasrv.leader import (
    Checkpointer,
    HeartbeatHandler,
    Judged,
    Mailbox,
    RegionRegistry,
    StatRow,
    TopicLocks,
    TopicRegionMap,
)
from metasrv.metrics import Metrics
from metasrv.model import RegionStat, prunable_entry_id
from metasrv.settings import load_settings
from metasrv.wire import RejectReason, encode_columns
from tests._gc import tracked_reachable
from tests._metrics import sample


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Setup:
    def __init__(self, kv: SqlKv, kafka_bootstrap: str, encoding: str = "json") -> None:
        self.encoding = encoding
        self.settings = load_settings(
            None, wal={"broker_endpoints": [kafka_bootstrap], "checkpoint_batch": 1000}
        )
        self.kv = kv
        for topic in ("t_0", "t_1"):  # registered on before: their markers record an id
            kv.put(keys.topic_name(topic), keys.encode_marker(keys.Marker(None, f"id-{topic}")))
        self.kafka = KafkaAdmin(kafka_bootstrap)
        self.registry = RegionRegistry()
        self.metrics = Metrics()
        self.region_map = TopicRegionMap(kv, self.kafka, TopicLocks(), self.settings)
        self.mailbox = Mailbox(self.registry, metrics=self.metrics)
        self.checkpointer = Checkpointer(
            self.region_map, self.registry, self.settings, self.metrics
        )
        self.region_map.removal_listeners.append(
            lambda r: self.registry.discard(r.region_id, r.topic)
        )
        self.clock = Clock()
        self.misrouted: list[RegionStat] = []
        self.handler = HeartbeatHandler(
            self.registry,
            self.region_map,
            self.mailbox,
            self.checkpointer,
            self.metrics,
            leader_addr=lambda: "leader:4000",
            clock=self.clock,
            on_misrouted=self.misrouted.extend,
        )
        self.judged: list[Judged] = []
        """Every heartbeat's judged outcome, in order."""
        judge = self.handler.judge
        columns = judge.columns

        def recorded(*args: Any) -> Judged:
            self.judged.append(columns(*args))
            return self.judged[-1]

        judge.columns = recorded  # type: ignore[method-assign,assignment]

    @property
    def recalled(self) -> bool:
        """The last heartbeat's regions were recalled: the table had them as sent."""
        verdict = self.judged[-1].verdict
        return verdict is not None and verdict.recalled

    def beat(self, regions: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """One heartbeat from datanode 1, in this setup's encoding."""
        if self.encoding == "columns":
            return self.beat_columns(regions, **extra)
        body = {"node_id": 1, "addr": "dn1:4001", "regions": regions, **extra}
        result: dict[str, Any] = orjson.loads(self.handler.handle(orjson.dumps(body)))
        return result

    def beat_columns(
        self, regions: list[dict[str, Any]], *, node_id: int = 1, topics: Any = None
    ) -> dict[str, Any]:
        rows = [
            (
                r["region_id"],
                r["topic"],
                r["flushed_entry_id"],
                r["topic_latest_entry_id"],
                r["memtable_bytes"],
                r["manifest_version"],
            )
            for r in regions
        ]
        body = encode_columns(node_id, "dn1:4001", rows, topics)
        result: dict[str, Any] = orjson.loads(self.handler.handle_columns(body))
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


@pytest.fixture(params=["json", "columns"])
async def hb(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Any:
    """A handler over a three-region map; `beat` sends JSON or the columns encoding (every
    test that uses `beat` checks both encodings give the same answers)."""
    kv = SqlKv.open("sqlite://", create=True)
    kv.batch_put(
        [
            (keys.topic_region("t_0", 1), keys.encode_route(1, None)),
            (keys.topic_region("t_0", 2), keys.encode_route(1, None)),
            (keys.topic_region("t_1", 3), keys.encode_route(1, 7)),
        ]
    )
    setup = Setup(kv, kafka_bootstrap, request.param)
    await setup.region_map.load()
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
    assert sample(hb.metrics, "metasrv_heartbeats_received_total") == 1
    assert sample(hb.metrics, "metasrv_region_stats_received_total") == 2


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
        reason: sample(hb.metrics, "metasrv_region_stats_rejected_total", {"reason": reason})
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


async def test_a_json_value_equal_to_the_columns_null_is_negative_id(hb: Setup) -> None:
    # -2**63 is a null in a column; in JSON it is a number below -1, on any field.
    null = -(2**63)
    resp = hb.handler.handle(
        orjson.dumps(
            {
                "node_id": 1,
                "regions": [
                    region(1, 5, latest=null),
                    region(2, null),
                    region(null, 5),
                    region(3, 7, topic="t_1", latest=9),
                ],
            }
        )
    )
    answer = orjson.loads(resp)["rejected"]
    assert answer == [
        {"region_id": 1, "reason": "negative_id"},
        {"region_id": 2, "reason": "negative_id"},
        {"region_id": null, "reason": "negative_id"},
    ]
    assert hb.registry.get(1) is None and hb.registry.get(2) is None
    stat = hb.registry.get(3)
    assert stat is not None and stat.topic_latest_entry_id == 9


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
    assert sample(hb.metrics, "metasrv_heartbeats_received_total") == 0


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
    await hb.region_map.deregister(1)
    assert hb.registry.get(1) is None
    assert rejected(hb.beat([region(1, 11)])) == {1: "unknown_region"}
    assert hb.registry.get(1) is None


async def test_a_remembered_region_list_is_not_reused_after_a_region_left_the_map(
    hb: Setup,
) -> None:
    # The steady state recalls a datanode's slots from its previous identical heartbeat.
    # A region removed from the map frees its slot, which the next new region takes: a
    # recall after that would write the old region's report into the new region's row.
    for flushed in (10, 11):
        hb.clock.now += 1
        assert hb.beat([region(1, flushed), region(2, 5)])["rejected"] == []
    await hb.region_map.deregister(1)
    await hb.region_map.register(4, 2, "t_0")
    assert hb.beat([region(4, 3)], node_id=2)["rejected"] == []
    hb.clock.now += 1
    assert rejected(hb.beat([region(1, 12), region(2, 6)])) == {1: "unknown_region"}
    four, two = hb.registry.get(4), hb.registry.get(2)
    assert four is not None and (four.node_id, four.flushed_entry_id) == (2, 3)
    assert two is not None and two.flushed_entry_id == 6 and hb.registry.get(1) is None


async def test_a_region_reporting_first_next_to_known_ones_gets_one_row(hb: Setup) -> None:
    # A heartbeat mixing known regions and a first report: the new region's row is made
    # once, and the next identical heartbeats update it in place (a datanode's region
    # list is recalled only once every region in it has a row).
    hb.beat([region(1, 10)])
    recalled = []
    for flushed in (11, 12, 13):
        hb.clock.now += 1
        assert hb.beat([region(1, flushed), region(2, flushed)])["rejected"] == []
        recalled.append(hb.recalled)
    assert recalled == [False, False, True] and len(hb.registry) == 2
    two = hb.registry.get(2)
    assert two is not None and two.flushed_entry_id == 13
    assert sorted(hb.registry.topic_snapshot("t_0")) == [1, 2]


async def test_a_new_terms_first_reports_are_recalled_on_the_next_heartbeat(
    kafka_bootstrap: str,
) -> None:
    # A new term's table is prepared from the map: a first report fills its region's
    # prepared slot, so the datanode's region list is recalled from its second heartbeat
    # on (a million second reports would otherwise each look up every region again).
    kv = SqlKv.open("sqlite://", create=True)
    try:
        kv.batch_put(
            [(keys.topic_region(f"t_{i % 2}", i), keys.encode_route(1, None)) for i in range(6)]
        )
        setup = Setup(kv, kafka_bootstrap, "columns")
        await setup.region_map.load()
        setup.registry.prepare(setup.region_map.routes_by_topic().items())

        def beat(flushed: int, regions: int = 6) -> list[Any]:
            setup.clock.now += 1
            reports = [region(i, flushed, topic=f"t_{i % 2}") for i in range(regions)]
            return list(setup.beat(reports)["rejected"])

        assert beat(10) == [] and setup.recalled  # the map's word: every one prepared
        assert beat(11) == [] and setup.recalled
        assert [setup.registry.get(i).flushed_entry_id for i in range(6)] == [11] * 6  # type: ignore[union-attr]
        # A region mapped during the term has no prepared slot: its first report is
        # stored, and the list is recalled once every region has a row.
        await setup.region_map.register(6, 1, "t_0")
        assert beat(12, regions=7) == [] and not setup.recalled
        assert beat(13, regions=7) == [] and not setup.recalled  # every one a row now
        assert beat(14, regions=7) == [] and setup.recalled
    finally:
        kv.close()


async def test_big_heartbeat_round_trip(kafka_bootstrap: str) -> None:
    # Guards the hot loop against per-region state leaking between iterations.
    kv = SqlKv.open("sqlite://", create=True)
    try:
        kv.batch_put(
            [(keys.topic_region(f"t_{i % 4}", i), keys.encode_route(1, None)) for i in range(2000)]
        )
        setup = Setup(kv, kafka_bootstrap)
        await setup.region_map.load()
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
    assert sample(hb.metrics, "metasrv_heartbeats_received_total") == 0


OVER = 2**63  # one past ID_MAX


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"node_id": OVER, "regions": []}, ["node_id"]),
        ({"node_id": 1, "regions": [region(OVER, 1)]}, ["regions", 0, "region_id"]),
        ({"node_id": 1, "regions": [region(1, OVER)]}, ["regions", 0, "flushed_entry_id"]),
        (
            {"node_id": 1, "regions": [region(1, 1, latest=OVER, memtable=0)]},
            ["regions", 0, "topic_latest_entry_id"],
        ),
        (
            {"node_id": 1, "regions": [region(1, 1, memtable=OVER)]},
            ["regions", 0, "memtable_bytes"],
        ),
        (
            {"node_id": 1, "regions": [region(1, 1, manifest=OVER)]},
            ["regions", 0, "manifest_version"],
        ),
        *[
            (
                {
                    "node_id": 1,
                    "regions": [],
                    "topics": [
                        {"topic": "t_0", "latest_entry_id": 1, "record_size": 1, "record_num": 1}
                        | {name: OVER}
                    ],
                },
                ["topics", 0, name],
            )
            for name in ("latest_entry_id", "record_size", "record_num")
        ],
    ],
)
async def test_every_id_and_counter_above_int64_is_a_422_naming_it(
    hb: Setup, body: dict[str, Any], loc: list[Any]
) -> None:
    # One range at every entry point (metasrv.model.ID_MAX): a value the kv, the stat
    # history or Kafka could not hold is refused before anything is stored.
    with pytest.raises(InvalidArgument) as info:
        hb.handler.handle(orjson.dumps(body))
    assert info.value.details["errors"][0]["loc"] == ["body", *loc]
    assert hb.registry.get(1) is None and hb.registry.topic_stats() == {}
    assert sample(hb.metrics, "metasrv_heartbeats_received_total") == 0


async def test_the_highest_int64_values_are_accepted(hb: Setup) -> None:
    top = 2**63 - 1
    resp = hb.beat(
        [region(1, top, memtable=top, manifest=top)],
        topics=[{"topic": "t_0", "latest_entry_id": top, "record_size": top, "record_num": 1}],
    )
    assert resp["rejected"] == []
    stat = hb.registry.get(1)
    assert stat is not None and stat.flushed_entry_id == top and stat.memtable_bytes == top
    topic = hb.registry.topic_stat("t_0")
    assert topic is not None and topic.latest_entry_id == top


@pytest.mark.parametrize(
    "regions",
    [
        [region(1, 10), region(2, 5), region(1, 11)],  # both accepted
        [region(1, 10), region(1, 10, topic="t_1")],  # one accepted, one misrouted
        [region(99, 1), region(99, 2)],  # both rejected
    ],
    ids=["both-accepted", "accepted-and-rejected", "both-rejected"],
)
async def test_a_region_reported_twice_is_a_422_and_nothing_is_stored(
    hb: Setup, regions: list[dict[str, Any]]
) -> None:
    with pytest.raises(InvalidArgument, match="reported more than once"):
        hb.beat(regions)
    assert hb.registry.get(1) is None and hb.registry.get(2) is None
    assert hb.checkpointer.dirty_count == 0
    assert sample(hb.metrics, "metasrv_heartbeats_received_total") == 0


async def test_a_region_twice_in_the_steady_state_is_still_refused(hb: Setup) -> None:
    hb.beat([region(1, 10), region(2, 5)])
    with pytest.raises(InvalidArgument, match="region 2 is reported more than once"):
        hb.beat([region(1, 11), region(2, 6), region(2, 7)])
    stat = hb.registry.get(2)
    assert stat is not None and stat.flushed_entry_id == 5


async def test_stored_rows_are_untracked_by_the_gc(hb: Setup) -> None:
    # A full collection must not walk the registry (a million rows at the design load,
    # #11): the table holds numbers in arrays and dicts of ints, none of them tracked,
    # whether a row was made by a first heartbeat or assigned by the steady state.
    # (First reports' topic membership waits as arrays in one list per topic until the
    # topic is read: both counts are taken after a read.)
    for flushed in (10, 11):  # a first report, then the steady state
        hb.clock.now += 1
        hb.beat([region(1, flushed)])
    assert hb.registry.topic_snapshot("t_0")[1].flushed_entry_id == 11
    one_row = tracked_reachable(hb.registry)
    for flushed in (12, 13):  # 2's row made by its first report, then both assigned
        hb.clock.now += 1
        hb.beat([region(1, flushed), region(2, flushed)])
    assert hb.registry.topic_snapshot("t_0")[2].flushed_entry_id == 13
    assert tracked_reachable(hb.registry) == one_row


async def test_an_idle_claim_next_to_a_memtable_is_stored_but_not_trusted(hb: Setup) -> None:
    # DESIGN §1: topic_latest_entry_id is reported only with an empty memtable. A claim
    # next to unflushed data would let a purge delete that data.
    hb.beat([region(1, 10, latest=500, memtable=4096), region(2, 10, latest=500, memtable=0)])
    busy, idle = hb.registry.get(1), hb.registry.get(2)
    assert busy is not None and busy.topic_latest_entry_id == 500
    assert busy.prunable_entry_id == 10 and busy.idle_claim_ignored
    assert idle is not None and idle.prunable_entry_id == 500 and not idle.idle_claim_ignored
    assert sample(hb.metrics, "metasrv_idle_claims_ignored_total") == 1
    # The rows the planner reads carry the same prunable ids.
    rows = hb.registry.topic_snapshot("t_0")
    assert (rows[1].prunable_entry_id, rows[2].prunable_entry_id) == (10, 500)
    # Steady state (the columns fast path for that encoding): still not trusted.
    hb.clock.now += 1
    hb.beat([region(1, 10, latest=600, memtable=4096), region(2, 10, latest=600, memtable=0)])
    assert hb.registry.topic_snapshot("t_0")[1].prunable_entry_id == 10
    assert hb.registry.topic_snapshot("t_0")[2].prunable_entry_id == 600
    assert sample(hb.metrics, "metasrv_idle_claims_ignored_total") == 2


async def test_topic_reports_for_topics_outside_the_map_are_not_kept(hb: Setup) -> None:
    junk = [
        {"topic": f"junk_{i}", "latest_entry_id": 1, "record_size": 10, "record_num": 1}
        for i in range(500)
    ]
    known = {"topic": "t_0", "latest_entry_id": 7, "record_size": 10, "record_num": 1}
    hb.beat([region(1, 1)], topics=[*junk, known])
    assert set(hb.registry.topic_stats()) == {"t_0"}
    assert sample(hb.metrics, "metasrv_topic_reports_ignored_total") == 500


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


async def test_deep_nesting_is_a_422_even_inside_an_unknown_field(hb: Setup) -> None:
    raw = b'{"node_id":1,"regions":[],"x":' + b"[" * 1000 + b"]" * 1000 + b"}"
    with pytest.raises(InvalidArgument, match="nested too deeply"):
        hb.handler.handle(raw)
    assert sample(hb.metrics, "metasrv_heartbeats_received_total") == 0


# The columns encoding: its own checks, and the same outcome as JSON for any sequence.


def columns_body(**columns: Any) -> bytes:
    import msgspec

    base = {
        "topic": np.array([0, 0], "<i8").tobytes(),
        "region_id": np.array([1, 2], "<i8").tobytes(),
        "flushed_entry_id": np.array([5, 6], "<i8").tobytes(),
        "memtable_bytes": np.array([0, 0], "<i8").tobytes(),
    }
    names = columns.pop("topic_names", ["t_0"])
    body = {"node_id": 1, "topic_names": names, "regions": base | columns}
    return msgspec.msgpack.encode(body)


@pytest.mark.parametrize(
    ("columns", "loc"),
    [
        ({"flushed_entry_id": np.array([5], "<i8").tobytes()}, ["flushed_entry_id"]),
        ({"region_id": b"\x01\x02\x03"}, ["region_id"]),
        ({"memtable_bytes": np.array([0, -1], "<i8").tobytes()}, ["memtable_bytes"]),
        ({"manifest_version": np.array([1, -5], "<i8").tobytes()}, ["manifest_version"]),
        ({"topic_latest_entry_id": b"\x00" * 24}, ["topic_latest_entry_id"]),
        ({"topic": np.array([0, 1], "<i8").tobytes()}, ["topic"]),
        ({"topic_names": [""]}, None),
        ({"region_id": [1, 2]}, ["region_id"]),
    ],
    ids=[
        "short",
        "ragged",
        "memtable",
        "manifest",
        "latest-length",
        "topic-index",
        "topic-name",
        "not-bin",
    ],
)
async def test_a_malformed_column_is_a_422_naming_it(
    hb: Setup, columns: dict[str, Any], loc: list[Any] | None
) -> None:
    with pytest.raises(InvalidArgument) as info:
        hb.handler.handle_columns(columns_body(**columns))
    where = info.value.details["errors"][0]["loc"]
    assert where == (["body", "topic_names", 0] if loc is None else ["body", "regions", *loc])
    assert hb.registry.get(1) is None
    assert sample(hb.metrics, "metasrv_heartbeats_received_total") == 0


async def test_a_body_that_is_not_msgpack_is_a_422(hb: Setup) -> None:
    with pytest.raises(InvalidArgument):
        hb.handler.handle_columns(b'{"node_id": 1, "groups": []}')


def stored(registry: RegionRegistry) -> dict[str, dict[int, StatRow]]:
    """Every row, by the topic it names."""
    return {t: dict(registry.topic_snapshot(t).items()) for t in registry.topics()}


class count_paths:
    """Counts heartbeats with regions accepted against their stored rows, and with
    regions judged against the map."""

    def __init__(self, handler: HeartbeatHandler) -> None:
        self.taken = self.declined = 0
        judge = handler.judge
        in_columns, by_route = judge.in_columns, judge.by_route

        def counted_columns(*args: Any) -> None:
            in_columns(*args)
            if args[3].steady is not None:
                self.taken += 1

        def counted_by_route(*args: Any) -> np.ndarray:
            self.declined += 1
            return by_route(*args)

        judge.in_columns = counted_columns  # type: ignore[method-assign,assignment]
        judge.by_route = counted_by_route  # type: ignore[method-assign,assignment]


async def test_columns_and_json_agree_on_random_heartbeat_sequences(kafka_bootstrap: str) -> None:
    """Leaders fed JSON, columns, and columns on a table prepared from the map (a new
    term's, `StatTable.prepare`) end every step in the same state."""
    rng = random.Random(7)
    kv = SqlKv.open("sqlite://", create=True)
    try:
        kv.batch_put(
            [(keys.topic_region(f"t_{i % 3}", i), keys.encode_route(1, None)) for i in range(1, 61)]
        )
        setups = [Setup(kv, kafka_bootstrap, e) for e in ("json", "columns", "columns")]
        for setup in setups:
            await setup.region_map.load()
        setups[2].registry.prepare(setups[2].region_map.routes_by_topic().items())
        flushed = {i: 0 for i in range(1, 80)}
        manifest = {i: 100 for i in range(1, 80)}
        paths = [count_paths(setup.handler) for setup in setups]
        for step in range(80):
            # Most steps are the steady state (mapped regions, ids moving forward); some
            # carry one fault: unmapped or misrouted ids, regressions, re-creations, bad ids.
            fault = rng.random() if step % 3 == 0 else 1.0
            regions = []
            for i in rng.sample(range(1, 61), 40) + (
                [rng.randrange(61, 80)] if fault < 0.2 else []
            ):
                roll = rng.random()
                if fault < 0.4 and roll < 0.1:
                    manifest[i] -= 1  # re-created: a lower manifest version and flushed id
                    flushed[i] = rng.randrange(0, 5)
                else:
                    flushed[i] += rng.randrange(0, 3)
                value = flushed[i]
                if fault < 0.6 and roll > 0.9:
                    value -= 3  # regressed, unless its manifest is null
                if fault < 0.7 and roll > 0.97:
                    value = -7  # negative_id
                memtable = 0 if rng.random() < 0.5 else rng.randrange(1, 1000)
                latest = rng.choice([None, value + rng.randrange(0, 50)])
                topic = f"t_{i % 3}"
                if fault < 0.8 and roll < 0.03:
                    topic = f"t_{(i + 1) % 3}"  # topic_mismatch
                regions.append(
                    region(
                        i,
                        value,
                        topic=topic,
                        latest=latest,
                        memtable=memtable,
                        manifest=None if fault < 0.5 and roll < 0.2 else manifest[i],
                    )
                )
            answers = []
            for setup in setups:
                setup.clock.now += 1
                answers.append(rejected(setup.beat(regions)))
            json_side = setups[0]
            for other in setups[1:]:
                assert answers[0] == answers[setups.index(other)], step
                assert stored(json_side.registry) == stored(other.registry), step
                assert len(json_side.registry) == len(other.registry), step
                assert json_side.checkpointer.dirty_count == other.checkpointer.dirty_count
                assert sample(json_side.metrics, "metasrv_idle_claims_ignored_total") == sample(
                    other.metrics, "metasrv_idle_claims_ignored_total"
                )
        for counted in paths:  # both paths ran, for each encoding
            assert counted.taken > 35 and counted.declined > 10
    finally:
        kv.close()


class PlainJudge:
    """The heartbeat rules of `metasrv.leader._judge`, region by region over a dict: the
    reference the column judge is compared with."""

    def __init__(self, routes: dict[int, tuple[str, int]]) -> None:
        self.routes = routes
        self.rows: dict[int, tuple[int, str, int, int | None, int, int | None, int]] = {}

    def beat(self, node: int, regions: list[dict[str, Any]]) -> list[tuple[int, str]]:
        rejected = []
        for r in regions:
            rid, topic, flushed = r["region_id"], r["topic"], r["flushed_entry_id"]
            latest, manifest = r["topic_latest_entry_id"], r["manifest_version"]
            if rid < 0 or flushed < -1 or (latest is not None and latest < -1):
                rejected.append((rid, "negative_id"))
                continue
            old = self.rows.get(rid)
            if old is not None and (old[1] != topic or old[0] != node):
                old = None  # the route decides
            if old is not None:
                old_manifest = old[5]
                recreated = (
                    manifest is not None and old_manifest is not None and manifest < old_manifest
                )
                if flushed < old[2] and not recreated:
                    rejected.append((rid, "stat_regressed"))
                    continue
            else:
                route = self.routes.get(rid)
                if route is None or route[0] != topic:
                    reason = "unknown_region" if route is None else "topic_mismatch"
                    rejected.append((rid, reason))
                    continue
                if route[1] != node:
                    rejected.append((rid, "wrong_node"))
                    continue
            memtable = r["memtable_bytes"]
            prunable = prunable_entry_id(flushed, latest, memtable)
            self.rows[rid] = (node, topic, flushed, latest, memtable, manifest, prunable)
        return rejected


@pytest.mark.parametrize("encoding", ["json", "columns", "prepared"])
async def test_the_column_judge_agrees_with_a_plain_per_region_model(
    kafka_bootstrap: str, encoding: str
) -> None:
    rng = random.Random(11)
    routes = {i: (f"t_{i % 3}", 1 + i % 2) for i in range(1, 61)}
    kv = SqlKv.open("sqlite://", create=True)
    try:
        kv.batch_put(
            [(keys.topic_region(t, i), keys.encode_route(n, None)) for i, (t, n) in routes.items()]
        )
        setup = Setup(kv, kafka_bootstrap, "json" if encoding == "json" else "columns")
        await setup.region_map.load()
        if encoding == "prepared":
            setup.registry.prepare(setup.region_map.routes_by_topic().items())
        model = PlainJudge(routes)
        seen: set[str] = set()
        flushed = dict.fromkeys(range(1, 80), 0)
        manifest = dict.fromkeys(range(1, 80), 100)
        for step in range(120):
            node = 1 + step % 2
            # Mostly each datanode's own regions, moving forward; now and then another's
            # (wrong_node), unmapped ids, other topics, regressions, re-creations, bad ids.
            own = [i for i in range(1, 61) if routes[i][1] == node]
            picked = rng.sample(own, 20) + rng.sample(range(1, 80), rng.choice([0, 0, 3]))
            regions = []
            for i in dict.fromkeys(picked):
                roll = rng.random()
                if roll < 0.05:
                    manifest[i] -= 1
                    flushed[i] = rng.randrange(0, 5)
                else:
                    flushed[i] += rng.randrange(0, 3)
                value = flushed[i] - (3 if roll > 0.92 else 0)
                if roll > 0.98:
                    value = -7
                topic = f"t_{(i + (roll < 0.03)) % 3}"
                latest = rng.choice([None, value + rng.randrange(0, 50)])
                version = None if roll < 0.1 else manifest[i]
                memtable = rng.choice([0, 0, 5])
                regions.append(
                    region(
                        i, value, topic=topic, latest=latest, memtable=memtable, manifest=version
                    )
                )
            setup.clock.now += 1
            if encoding == "json":
                body = {"node_id": node, "regions": regions}
                answer = orjson.loads(setup.handler.handle(orjson.dumps(body)))
            else:
                answer = setup.beat_columns(regions, node_id=node)
            expected = model.beat(node, regions)
            assert [(r["region_id"], r["reason"]) for r in answer["rejected"]] == expected, step
            seen.update(reason for _, reason in expected)
            stored_rows = {
                rid: (
                    row.node_id,
                    t,
                    row.flushed_entry_id,
                    row.topic_latest_entry_id,
                    row.memtable_bytes,
                    row.manifest_version,
                    row.prunable_entry_id,
                )
                for t, rows in stored(setup.registry).items()
                for rid, row in rows.items()
            }
            assert stored_rows == model.rows, step
        assert seen == {reason.value for reason in RejectReason}  # every rule exercised
    finally:
        kv.close()
