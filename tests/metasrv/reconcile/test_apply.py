"""The apply planner's decisions and the executor's idempotence (pure: in-memory doubles).

The HTTP path against a real metasrv is covered in test_run.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from metasrv import wire
from metasrv.errors import Conflict, NotFound, Unavailable
from metasrv.reconcile import (
    HIDES_ENTRIES,
    ActionKind,
    Finding,
    FindingKind,
    Outcome,
    Severity,
    execute_plan,
    plan_actions,
    registration_hides,
)


def _f(kind: FindingKind, topic: str | None, region: int | None, **ev: Any) -> Finding:
    return Finding(kind, Severity.WARNING, topic, region, "", ev)


@dataclass
class FakeMetasrv:
    """Regions by id -> (topic, node, stat age); what the API would answer."""

    regions: dict[int, tuple[str, int, float | None]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    down: bool = False
    topics: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    """Topics the leader knows -> (pruned_entry_id, log_start_offset)."""

    def topic(self, topic: str) -> wire.Topic:
        if topic not in self.topics:
            raise NotFound(f"unknown topic(s): {topic}")
        pruned, log_start = self.topics[topic]
        return wire.Topic(
            topic=topic,
            prune_point=None,
            pruned_entry_id=pruned,
            log_start_offset=log_start,
            high_watermark=None,
            blocked_by=[],
            reclaimable_entries=0,
            data_loss=[],
            region_count=0,
            pool=True,
            latest_entry_id=None,
            avg_record_size=None,
        )

    def add_region(self, region_id: int, node_id: int, topic: str | None = None) -> Any:
        self.calls.append(f"add {region_id}")
        if self.down:
            raise Unavailable("metasrv at http://x is unreachable")
        if region_id in self.regions:
            raise Conflict(f"region {region_id} already registered")
        assert topic is not None
        self.regions[region_id] = (topic, node_id, None)

    def drop_region(self, region_id: int) -> None:
        self.calls.append(f"drop {region_id}")
        if self.regions.pop(region_id, None) is None:
            raise NotFound(f"region {region_id} not registered")

    def region(self, region_id: int) -> wire.Region:
        if region_id not in self.regions:
            raise NotFound(f"region {region_id} not registered")
        topic, node, age = self.regions[region_id]
        stat = None
        if age is not None:
            stat = wire.RegionStat(
                node_id=node,
                flushed_entry_id=0,
                topic_latest_entry_id=None,
                memtable_bytes=0,
                manifest_version=None,
                prunable_entry_id=0,
                idle_claim_ignored=False,
                age_seconds=age,
            )
        return wire.Region(
            region_id=region_id,
            topic=topic,
            node_id=node,
            checkpoint_entry_id=None,
            stat=stat,
            prunable_entry_id=None if stat is None else 0,
            pruned_entry_id=None,
            replay_start_entry_id=0,
        )


@dataclass
class FakeKafka:
    topics: set[str] = field(default_factory=set)

    def ensure_topics(
        self,
        topics: Iterable[str],
        *,
        replication_factor: int = 1,
        config: Mapping[str, str] | None = None,
    ) -> list[str]:
        new = sorted(set(topics) - self.topics)
        self.topics |= set(new)
        return new


FINDINGS = [
    _f(FindingKind.MISSING_TOPIC, "p_3", None, held_data=False),
    _f(FindingKind.MISSING_TOPIC, "p_4", None, held_data=True),
    _f(FindingKind.UNMAPPED_REGION, "p_1", 8, node_id=4, prunable_entry_id=10),
    _f(FindingKind.UNMAPPED_REGION, "p_3", 9, node_id=5, prunable_entry_id=-1),  # topic created
    _f(FindingKind.UNMAPPED_REGION, "gone", 10, node_id=5, prunable_entry_id=3),
    _f(FindingKind.STALE_REGION, "p_0", 2, age_s=7200, unseen_for_at_least_s=None),
    _f(FindingKind.STALE_REGION, "p_0", 3, age_s=None, unseen_for_at_least_s=4000),
    _f(FindingKind.STALE_REGION, "p_1", 4, age_s=100, unseen_for_at_least_s=None),
    _f(FindingKind.TOPIC_MISMATCH, "p_1", 5, reported_topic="p_0"),
    _f(FindingKind.RETENTION_OVERRUN, "p_1", 6),
    _f(FindingKind.ORPHAN_TOPIC, "p_9", None),
    _f(FindingKind.SKEW, None, None),
]


def test_plan_repairs_only_the_safe_classes() -> None:
    plan = plan_actions(FINDINGS, kafka_topics={"p_0", "p_1"}, drop_stale_after=3600)
    assert [(a.kind, a.topic, a.region_id, a.node_id) for a in plan.actions] == [
        (ActionKind.CREATE_TOPIC, "p_3", None, None),
        (ActionKind.REGISTER_REGION, "p_1", 8, 4),
        (ActionKind.REGISTER_REGION, "p_3", 9, 5),
        (ActionKind.DROP_REGION, "p_0", 2, None),
        (ActionKind.DROP_REGION, "p_0", 3, None),
    ]
    assert dict(plan.skipped) == {
        "missing topic held data: recreating it would hide WAL data loss": 1,
        "reported topic does not exist in Kafka": 1,
        "stale for less than --drop-stale-after": 1,
    }


def test_stale_regions_stay_without_drop_stale_after() -> None:
    plan = plan_actions(FINDINGS, kafka_topics={"p_0", "p_1"}, drop_stale_after=None)
    assert ActionKind.DROP_REGION not in {a.kind for a in plan.actions}
    assert plan.skipped["stale regions are dropped only with --drop-stale-after"] == 3


def test_executing_twice_changes_nothing_the_second_time() -> None:
    api = FakeMetasrv(regions={2: ("p_0", 1, None), 3: ("p_0", 1, None), 1: ("p_0", 1, 2.0)})
    kafka = FakeKafka({"p_0", "p_1"})
    plan = plan_actions(FINDINGS, kafka_topics=kafka.topics, drop_stale_after=3600)
    first = execute_plan(plan, api, kafka)
    assert [r.outcome for r in first] == [Outcome.DONE] * 5
    assert api.regions == {1: ("p_0", 1, 2.0), 8: ("p_1", 4, None), 9: ("p_3", 5, None)}
    assert kafka.topics == {"p_0", "p_1", "p_3"}
    second = execute_plan(plan, api, kafka)
    assert [r.outcome for r in second] == [Outcome.ALREADY] * 5
    assert api.regions == {1: ("p_0", 1, 2.0), 8: ("p_1", 4, None), 9: ("p_3", 5, None)}


def test_a_region_heard_from_again_or_moved_is_not_dropped() -> None:
    api = FakeMetasrv(regions={2: ("p_0", 1, 5.0), 3: ("p_1", 1, None)})
    plan = plan_actions(
        [f for f in FINDINGS if f.kind is FindingKind.STALE_REGION],
        kafka_topics=set(),
        drop_stale_after=3600,
    )
    results = execute_plan(plan, api, FakeKafka())
    assert [(r.action.region_id, r.outcome) for r in results] == [
        (2, Outcome.SKIPPED),
        (3, Outcome.SKIPPED),
    ]
    assert "heard from it 5s ago" in results[0].detail
    assert "now mapped to p_1" in results[1].detail
    assert set(api.regions) == {2, 3}
    assert not [c for c in api.calls if c.startswith("drop")]


def test_an_unreachable_metasrv_stops_the_apply_keeping_what_was_done() -> None:
    api = FakeMetasrv(down=True)
    plan = plan_actions(FINDINGS, kafka_topics={"p_0", "p_1"}, drop_stale_after=None)
    done: list[Any] = []
    with pytest.raises(Unavailable):
        execute_plan(plan, api, FakeKafka({"p_0", "p_1"}), collect=done)
    assert [(r.action.kind, r.outcome) for r in done] == [(ActionKind.CREATE_TOPIC, Outcome.DONE)]


HIDDEN = [
    # Needs entries from 5; the marker is at 8: purges ran without it.
    _f(FindingKind.UNMAPPED_REGION, "p_1", 11, node_id=4, prunable_entry_id=4, pruned_entry_id=8),
    # Needs entries from 5; Kafka starts at 9: they are gone.
    _f(FindingKind.UNMAPPED_REGION, "p_1", 12, node_id=4, prunable_entry_id=4, log_start_offset=9),
    # What it needs cannot be checked.
    _f(FindingKind.UNMAPPED_REGION, "p_1", 13, node_id=4),
]
SAFE = [
    # Needs entries from 9, the marker is 8 and Kafka starts at 8: nothing is hidden.
    _f(
        FindingKind.UNMAPPED_REGION,
        "p_1",
        14,
        node_id=4,
        prunable_entry_id=8,
        pruned_entry_id=8,
        log_start_offset=8,
    ),
]


def test_a_region_needing_entries_below_the_marker_or_log_start_is_not_registered() -> None:
    plan = plan_actions([*HIDDEN, *SAFE], kafka_topics={"p_1"}, drop_stale_after=None)
    assert [(a.kind, a.region_id) for a in plan.actions] == [(ActionKind.REGISTER_REGION, 14)]
    assert dict(plan.skipped) == {HIDES_ENTRIES: 3}
    assert plan.skipped_examples[HIDES_ENTRIES] == [f.key for f in HIDDEN]


def test_a_marker_moved_since_the_run_stops_the_registration() -> None:
    """A purge ran after the reconcile read the topic (without the region: it is unmapped)."""
    plan = plan_actions(SAFE, kafka_topics={"p_1"}, drop_stale_after=None)
    api = FakeMetasrv(topics={"p_1": (20, 20)})
    (result,) = execute_plan(plan, api, FakeKafka({"p_1"}))
    assert result.outcome is Outcome.SKIPPED
    assert "WAL data loss: it needs entries from 9, at or below the topic's marker 20" in (
        result.detail
    )
    assert api.regions == {}
    assert not [c for c in api.calls if c.startswith("add")]
    api.topics["p_1"] = (8, 8)  # as the run saw it: registered
    (result,) = execute_plan(plan, api, FakeKafka({"p_1"}))
    assert result.outcome is Outcome.DONE
    assert api.regions == {14: ("p_1", 4, None)}


@pytest.mark.parametrize(
    ("prunable", "marker", "log_start", "hides"),
    [
        (None, None, None, True),
        (-1, None, 0, False),  # a new region on a fresh topic
        (4, 5, 0, True),  # entry 5 would be skipped by replay-start
        (5, 5, 5, False),
        (4, None, 5, False),  # needs 5, Kafka starts at 5
        (3, None, 5, True),
    ],
)
def test_registration_hides(
    prunable: int | None, marker: int | None, log_start: int | None, hides: bool
) -> None:
    assert (registration_hides(prunable, marker, log_start) is not None) is hides
