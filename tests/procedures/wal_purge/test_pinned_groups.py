"""Pinned consumer groups in the plan and the purge's decisions (DESIGN §8): a group's
committed offset bounds every purge, P' = min(P, committed offset); a group with none
blocks the topic. Pure: plans from the real `plan_topic`, decisions from the real
`decide_*`, the API's rendering from `api.answers.plan`.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from api import answers
from cli import why_not_purged
from metasrv import wire
from metasrv.keys import Marker
from metasrv.leader import StatRow
from metasrv.metrics import Metrics
from metasrv.model import PartitionOffsets, RegionRoute, TopicPlan
from procedures.wal_purge import (
    Advance,
    CatchUp,
    Cut,
    Skip,
    Wait,
    decide_prepare,
    decide_purge,
    export_gauges,
    nothing_to_cut,
    plan_topic,
)
from tests.procedures.wal_purge.protocol_model._stats import ModelTopicStats

TOPIC = "wal_0"
NOW = 1000.0


def _row(flushed: int) -> StatRow:
    return StatRow(1, TOPIC, flushed, None, 1, 1, NOW - 1.0, flushed)


def plan_of(
    flushed: Mapping[int, int | None],
    pinned: Mapping[str, int | None] | None,
    *,
    marker: int | None = None,
    offsets: PartitionOffsets | None = None,
) -> TopicPlan:
    """A plan of regions `flushed` (region id -> flushed id, None: no stat)."""
    routes = {r: RegionRoute(r, TOPIC, 1, None) for r in flushed}
    rows = {r: _row(f) for r, f in flushed.items() if f is not None}
    return plan_topic(
        TOPIC,
        routes,
        ModelTopicStats(rows),
        now=NOW,
        stat_ttl=30.0,
        pruned_entry_id=marker,
        offsets=PartitionOffsets(0, 100) if offsets is None else offsets,
        marker=None if marker is None else Marker(marker),
        offsets_asked_at=NOW,
        pinned=pinned,
    )


def _groups(plan: TopicPlan) -> list[tuple[str, int | None, int | None, bool]]:
    return [(g.group, g.committed_offset, g.lag, g.holds) for g in plan.pinned_groups]


# --- the plan -------------------------------------------------------------------------


def test_without_pinned_groups_the_plan_is_the_regions_own() -> None:
    unpinned: tuple[dict[str, int | None] | None, ...] = (None, {})
    for pinned in unpinned:
        plan = plan_of({1: 40, 2: 50}, pinned)
        assert plan.prune_point == 40
        assert plan.pinned_groups == () and plan.blocking_groups == ()
        assert plan.pinned_bound is None


def test_a_group_behind_the_regions_holds_the_prune_point_at_its_committed_offset() -> None:
    plan = plan_of({1: 40, 2: 50}, {"cdc": 25, "standby": 70})
    # Committed offset 25: the group reads 25 next, so DeleteRecords(25) keeps it.
    assert plan.prune_point == 25
    assert plan.reclaimable_entries == 25
    assert plan.blocked_by == () and plan.blocking_groups == ()
    assert _groups(plan) == [("cdc", 25, 75, True), ("standby", 70, 30, False)]
    assert plan.pinned_bound == 25


def test_a_group_ahead_of_the_regions_holds_nothing() -> None:
    plan = plan_of({1: 40}, {"cdc": 40, "standby": 100})
    assert plan.prune_point == 40
    assert _groups(plan) == [("cdc", 40, 60, False), ("standby", 100, 0, False)]


def test_two_groups_at_the_bound_both_hold_it() -> None:
    plan = plan_of({1: 40}, {"a": 10, "b": 10, "c": 30})
    assert plan.prune_point == 10
    assert [g.group for g in plan.pinned_groups if g.holds] == ["a", "b"]


def test_a_group_with_no_committed_offset_blocks_the_topic() -> None:
    plan = plan_of({1: 40}, {"cdc": None, "standby": 30})
    assert plan.prune_point is None and plan.reclaimable_entries == 0
    assert plan.blocking_groups == ("cdc",)
    assert plan.blocked_by == ()  # regions only; the API adds the group (below)
    assert _groups(plan) == [("cdc", None, None, False), ("standby", 30, 70, False)]
    decision = decide_prepare(plan, [], logical_delete=False)
    assert isinstance(decision, Skip)
    assert "consumer group cdc (no_committed_offset)" in decision.reason


def test_a_blocked_region_and_a_blocking_group_are_both_named() -> None:
    plan = plan_of({1: 40, 2: None}, {"cdc": None})
    assert plan.prune_point is None
    assert [(b.region_id, b.reason) for b in plan.blocked_by] == [(2, "no_stat")]
    assert plan.blocking_groups == ("cdc",)
    decision = decide_prepare(plan, [], logical_delete=False)
    assert isinstance(decision, Skip)
    assert "consumer group cdc" in decision.reason and "2 (no_stat)" in decision.reason


def test_a_group_below_the_marker_still_bounds_what_is_deleted() -> None:
    # Marker 50 (regions need nothing <= 50) but the log start is 10 and the group reads
    # 30 next: the purge deletes below 30, never past it, and the marker stays.
    plan = plan_of({1: 60}, {"cdc": 30}, marker=50, offsets=PartitionOffsets(10, 100))
    assert plan.prune_point == 30
    assert nothing_to_cut(plan) is None  # work: delete [10, 30)
    assert decide_prepare(plan, [], logical_delete=False) == Cut(30)
    # Once the log start is there, nothing is left, and the reason names the group.
    there = plan_of({1: 60}, {"cdc": 30}, marker=50, offsets=PartitionOffsets(30, 100))
    idle = nothing_to_cut(there)
    assert idle is not None and "held by consumer group cdc" in idle


def test_a_topic_reset_keeps_showing_the_groups() -> None:
    plan = plan_of({1: 40}, {"cdc": 5}, marker=80, offsets=PartitionOffsets(0, 30))
    assert plan.topic_reset is not None and plan.prune_point is None
    assert _groups(plan) == [("cdc", 5, 25, False)]


# --- the purge step's decision --------------------------------------------------------


def test_a_persisted_target_past_a_group_is_lowered_to_its_offset() -> None:
    # The target 40 was persisted before the group's offset (20) was read: a resume.
    plan = plan_of({1: 40}, {"cdc": 20}, marker=10)
    decision = decide_purge(40, plan, planned_topic_id=None, logical_delete=False)
    assert decision == Advance(20, lowered=True)


def test_a_group_at_the_marker_leaves_nothing_to_advance() -> None:
    plan = plan_of({1: 40}, {"cdc": 10}, marker=10)
    decision = decide_purge(40, plan, planned_topic_id=None, logical_delete=False)
    assert isinstance(decision, Skip)


def test_a_catch_up_deletes_only_below_the_group() -> None:
    # The marker reached the target 40 before the group was pinned; the group reads 25.
    plan = plan_of({1: 40}, {"cdc": 25}, marker=40)
    decision = decide_purge(40, plan, planned_topic_id=None, logical_delete=False)
    assert decision == CatchUp(25)
    ahead = plan_of({1: 40}, {"cdc": 90}, marker=40)
    assert decide_purge(40, ahead, planned_topic_id=None, logical_delete=False) == CatchUp(40)


def test_a_group_without_an_offset_makes_the_purge_step_wait() -> None:
    for marker in (10, 40):  # re-validating, and catching up
        plan = plan_of({1: 40}, {"cdc": None}, marker=marker)
        decision = decide_purge(40, plan, planned_topic_id=None, logical_delete=False)
        assert isinstance(decision, Wait), decision
        assert decision.groups == ("cdc",)


worlds = st.fixed_dictionaries(
    {
        "flushed": st.dictionaries(
            st.integers(1, 4), st.one_of(st.none(), st.integers(-1, 60)), min_size=1
        ),
        "pinned": st.dictionaries(
            st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.integers(0, 70))
        ),
        "marker": st.one_of(st.none(), st.integers(-1, 60)),
        "log_start": st.integers(0, 60),
        "target": st.integers(0, 60),
    }
)


@settings(max_examples=400, deadline=None)
@given(world=worlds)
def test_nothing_at_or_above_a_pinned_groups_offset_is_ever_cut(world: dict) -> None:  # type: ignore[type-arg]
    pinned: dict[str, int | None] = world["pinned"]
    marker = world["marker"]
    offsets = PartitionOffsets(world["log_start"], 61)
    plan = plan_of(world["flushed"], pinned, marker=marker, offsets=offsets)
    known = [c for c in pinned.values() if c is not None]
    if None in pinned.values():
        assert plan.prune_point is None
    if plan.prune_point is not None and known:
        assert plan.prune_point <= min(known)
    decision = decide_purge(world["target"], plan, planned_topic_id=None, logical_delete=False)
    if isinstance(decision, Advance | CatchUp):
        assert None not in pinned.values()
        assert not known or decision.target <= min(known)


# --- what the API, the CLI's table and the gauges show ----------------------------------


def test_the_api_names_a_blocking_group_instead_of_a_region() -> None:
    plan = plan_of({1: 40, 2: None}, {"cdc": None, "standby": 30})
    shown = msgspec.json.decode(msgspec.json.encode(answers.plan(plan)))
    assert shown["blocked_by"] == [
        {"region_id": 2, "reason": "no_stat"},
        {"consumer_group": "cdc", "reason": "no_committed_offset"},
    ]
    assert shown["pinned_groups"] == [
        {"consumer_group": "cdc", "committed_offset": None, "lag": None,
         "holds_prune_point": False},
        {"consumer_group": "standby", "committed_offset": 30, "lag": 70,
         "holds_prune_point": False},
    ]  # fmt: skip
    # A client decodes it back.
    back = msgspec.json.decode(msgspec.json.encode(answers.plan(plan)), type=wire.TopicPlan)
    assert [b.consumer_group for b in back.blocked_by] == [None, "cdc"]


def test_the_cli_table_names_the_blocking_group() -> None:
    plan = plan_of({1: 40}, {"cdc": None})
    assert why_not_purged(answers.plan(plan)) == (
        "blocked by consumer group cdc (no_committed_offset)"
    )
    held = plan_of({1: 40}, {"cdc": 25})
    assert why_not_purged(answers.plan(held)) == (
        "purgeable: 25 entries below 25 (held by consumer group cdc)"
    )


def test_the_gauges_show_each_groups_lag_and_whether_it_blocks() -> None:
    metrics = Metrics()
    plans = {
        "wal_0": plan_of({1: 40}, {"cdc": 25, "standby": None}),
    }
    export_gauges(metrics, plans, {})
    sample = metrics.registry.get_sample_value
    assert sample("metasrv_wal_pinned_group_lag", {"topic": "wal_0", "group": "cdc"}) == 75
    assert sample("metasrv_wal_pinned_group_lag", {"topic": "wal_0", "group": "standby"}) is None
    assert sample("metasrv_wal_pinned_group_blocking", {"topic": "wal_0", "group": "cdc"}) == 0
    assert sample("metasrv_wal_pinned_group_blocking", {"topic": "wal_0", "group": "standby"}) == 1
