"""The prune plan's rules (DESIGN §1-2): exhaustive cases plus properties over random maps.

Stats reach the planner as the leader keeps them: rows stored by heartbeats, one topic's
copied at a time (`RegionRegistry.topic_snapshot`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metasrv.leader import RegionRegistry
from metasrv.model import PartitionOffsets, RegionRoute, RegionStat, TopicPlan
from procedures.wal_purge import (
    NO_STAT,
    RETENTION_OVERRUN,
    STALE_STAT,
    TOPIC_RESET,
    entries_freed,
    nothing_to_cut,
    plan_topic,
)
from tests._stats import report

TOPIC = "wal_0"
NOW = 1000.0
TTL = 30.0


def route(region_id: int, topic: str = TOPIC) -> RegionRoute:
    return RegionRoute(region_id=region_id, topic=topic, node_id=1, checkpoint_entry_id=None)


def stat(
    region_id: int,
    flushed: int,
    latest: int | None = None,
    *,
    age: float = 1.0,
    topic: str = TOPIC,
) -> RegionStat:
    return RegionStat(
        region_id=region_id,
        node_id=1,
        topic=topic,
        flushed_entry_id=flushed,
        topic_latest_entry_id=latest,
        memtable_bytes=0,
        manifest_version=1,
        received_at=NOW - age,
    )


def registry_of(stats: list[RegionStat]) -> RegionRegistry:
    """The stats as the leader holds them, each row under the topic it names."""
    registry = RegionRegistry()
    report(registry, stats)
    return registry


def plan(
    routes: list[RegionRoute],
    stats: list[RegionStat],
    *,
    pruned: int | None = None,
    offsets: PartitionOffsets | None = None,
    offsets_asked_at: float | None = None,
) -> TopicPlan:
    return plan_topic(
        TOPIC,
        routes,
        registry_of(stats).topic_snapshot(TOPIC),
        now=NOW,
        stat_ttl=TTL,
        pruned_entry_id=pruned,
        offsets=offsets,
        offsets_asked_at=offsets_asked_at,
    )


def reasons(p: TopicPlan) -> dict[int, str]:
    return {b.region_id: b.reason for b in p.blocked_by}


# --- P is the minimum over every mapped region ------------------------------------------


def test_prune_point_is_min_prunable_over_all_regions() -> None:
    p = plan([route(1), route(2), route(3)], [stat(1, 50), stat(2, 20), stat(3, 90)])
    assert p.prune_point == 20
    assert p.blocked_by == ()
    assert p.region_count == 3


def test_idle_region_uses_topic_latest_entry_id() -> None:
    # Region 2 flushed only to 5 but its memtable is empty at topic latest 80: it must not pin.
    p = plan([route(1), route(2)], [stat(1, 60), stat(2, 5, latest=80)])
    assert p.prune_point == 60


def test_topic_latest_below_flushed_is_ignored() -> None:
    p = plan([route(1)], [stat(1, 60, latest=10)])
    assert p.prune_point == 60


def test_stats_of_unmapped_regions_are_ignored() -> None:
    p = plan([route(1)], [stat(1, 60), stat(99, 0)])
    assert p.prune_point == 60


def test_topic_without_regions_has_no_prune_point_and_no_blockers() -> None:
    p = plan([], [stat(1, 60)], pruned=7, offsets=PartitionOffsets(3, 100))
    assert p.prune_point is None
    assert p.blocked_by == ()
    assert p.reclaimable_entries == 0
    assert p.region_count == 0
    assert (p.pruned_entry_id, p.log_start_offset, p.high_watermark) == (7, 3, 100)


# --- blocking: missing, stale, reported on another topic ---------------------------------


def test_region_without_stat_blocks() -> None:
    p = plan([route(1), route(2)], [stat(1, 60)])
    assert p.prune_point is None
    assert reasons(p) == {2: NO_STAT}
    assert p.reclaimable_entries == 0


def test_stale_stat_blocks() -> None:
    p = plan([route(1), route(2)], [stat(1, 60), stat(2, 90, age=TTL + 0.001)])
    assert p.prune_point is None
    assert reasons(p) == {2: STALE_STAT}


def test_stat_exactly_ttl_old_is_still_fresh() -> None:
    p = plan([route(1)], [stat(1, 60, age=TTL)])
    assert p.prune_point == 60


def test_stat_reported_on_another_topic_counts_as_missing() -> None:
    p = plan([route(1)], [stat(1, 60, topic="other")])
    assert reasons(p) == {1: NO_STAT}
    assert p.prune_point is None


def test_after_leader_change_every_topic_is_blocked() -> None:
    # Invariant 3: the new leader starts with empty stats.
    p = plan([route(1), route(2)], [], offsets=PartitionOffsets(0, 100))
    assert p.prune_point is None
    assert reasons(p) == {1: NO_STAT, 2: NO_STAT}


def test_every_blocking_region_is_named() -> None:
    p = plan(
        [route(1), route(2), route(3), route(4)],
        [stat(1, 60), stat(3, 70, age=100.0)],
    )
    assert reasons(p) == {2: NO_STAT, 3: STALE_STAT, 4: NO_STAT}


# --- Kafka offsets: high watermark clamp, retention overrun -------------------------------


def test_prune_point_is_at_most_the_latest_written_entry() -> None:
    # P is also the new marker ("no region needs an entry <= P"): at most HWM - 1. A stat
    # received after Kafka was asked (NOW - 5) may name entries written since.
    offsets = PartitionOffsets(0, 300)
    p = plan([route(1)], [stat(1, 500, latest=900)], offsets=offsets, offsets_asked_at=NOW - 5)
    assert p.prune_point == 299
    assert p.reclaimable_entries == 299
    # Received before Kafka was asked, the same report names entries the topic lacks.
    reset = plan([route(1)], [stat(1, 500, latest=900)], offsets=offsets, offsets_asked_at=NOW)
    assert reset.prune_point is None and reset.topic_reset is not None


def test_an_empty_partition_has_nothing_to_purge() -> None:
    p = plan([route(1)], [stat(1, -1)], offsets=PartitionOffsets(0, 0))
    assert p.prune_point == -1
    assert p.reclaimable_entries == 0


def test_reclaimable_is_prune_point_minus_log_start() -> None:
    p = plan([route(1), route(2)], [stat(1, 80), stat(2, 95)], offsets=PartitionOffsets(30, 100))
    assert p.prune_point == 80
    assert p.reclaimable_entries == 50


def test_nothing_reclaimable_when_log_start_already_at_or_above_prune_point() -> None:
    p = plan([route(1)], [stat(1, 80)], pruned=80, offsets=PartitionOffsets(81, 100))
    assert p.prune_point == 80
    assert p.reclaimable_entries == 0
    assert p.blocked_by == ()  # log start 81 == prunable + 1: nothing needed is gone


def test_without_offsets_reclaimable_is_measured_from_pruned_marker() -> None:
    assert plan([route(1)], [stat(1, 80)], pruned=50).reclaimable_entries == 30
    assert plan([route(1)], [stat(1, 40)], pruned=50).reclaimable_entries == 0
    assert plan([route(1)], [stat(1, 40)]).reclaimable_entries == 40


@pytest.mark.parametrize(
    ("log_start", "pruned", "logical", "freed"),
    [
        (30, 50, False, 50),  # Kafka's log start: what a DeleteRecords to 80 removes
        (30, 50, True, 30),  # logical deletion: nothing left Kafka, the marker's are gone
        (60, 50, True, 20),  # ... and Kafka's retention may have gone further
        (None, 50, False, 30),  # no offsets: the marker stands in for the log start
        (None, None, False, 80),
        (90, None, False, 0),  # at or below what is gone already
    ],
)
def test_entries_freed_count_from_what_is_gone_already(
    log_start: int | None, pruned: int | None, logical: bool, freed: int
) -> None:
    assert entries_freed(80, log_start, pruned, logical_delete=logical) == freed


def test_retention_overrun_is_data_loss_and_blocks() -> None:
    # Region 2 needs entries from 21 on; Kafka starts at 40: 21..39 are gone.
    p = plan([route(1), route(2)], [stat(1, 60), stat(2, 20)], offsets=PartitionOffsets(40, 100))
    assert p.data_loss == (2,)
    assert reasons(p) == {2: RETENTION_OVERRUN}
    assert p.prune_point is None
    assert p.reclaimable_entries == 0


def test_retention_overrun_clears_once_region_flushes_past_gap() -> None:
    p = plan([route(1), route(2)], [stat(1, 60), stat(2, 45)], offsets=PartitionOffsets(40, 100))
    assert p.data_loss == ()
    assert p.prune_point == 45


def test_log_start_exactly_prunable_plus_one_is_not_data_loss() -> None:
    p = plan([route(1)], [stat(1, 39)], offsets=PartitionOffsets(40, 100))
    assert p.data_loss == ()
    assert p.prune_point == 39
    assert p.reclaimable_entries == 0


def test_overrun_checked_only_for_fresh_stats() -> None:
    # A stale region is blocked as stale; it is not also counted as data loss.
    p = plan([route(1)], [stat(1, 5, age=100.0)], offsets=PartitionOffsets(40, 100))
    assert reasons(p) == {1: STALE_STAT}
    assert p.data_loss == ()


# --- never raised (Kafka DeleteRecords offset -1 means "everything") ----------------------


def test_nothing_flushed_gives_prune_point_minus_one_nothing_to_delete() -> None:
    # Raising P to 0 would store marker 0 and make the region replay from 1, losing entry 0.
    p = plan([route(1), route(2)], [stat(1, -1), stat(2, 50)], offsets=PartitionOffsets(0, 100))
    assert p.prune_point == -1
    assert p.reclaimable_entries == 0


# --- the marker: a region's need is max(prunable, pruned_entry_id) ----------------------


def test_region_below_marker_needs_nothing_below_it() -> None:
    # Region 1 reported less than the marker (registered after the purge, or idle while the
    # marker moved and then written again): it replays from max(10, 50) + 1 anyway.
    p = plan(
        [route(1), route(2)],
        [stat(1, 10), stat(2, 200)],
        pruned=50,
        offsets=PartitionOffsets(50, 300),
    )
    assert p.prune_point == 50
    assert p.reclaimable_entries == 0
    assert p.data_loss == ()
    assert p.blocked_by == ()


def test_idle_region_that_writes_again_is_not_data_loss() -> None:
    # Idle at topic latest 12 -> purge to 12; then it writes 13.. and reports flushed 2 again.
    p = plan(
        [route(1), route(2)],
        [stat(1, 2), stat(2, 17)],
        pruned=12,
        offsets=PartitionOffsets(12, 18),
    )
    assert p.data_loss == ()
    assert p.prune_point == 12  # no progress until region 1 flushes, but not blocked


def test_new_region_with_nothing_flushed_on_a_purged_topic_is_not_data_loss() -> None:
    p = plan(
        [route(1), route(2)],
        [stat(1, -1), stat(2, 90)],
        pruned=40,
        offsets=PartitionOffsets(40, 100),
    )
    assert p.data_loss == ()
    assert p.prune_point == 40


def test_retention_past_the_marker_is_still_data_loss() -> None:
    # Kafka retention (not us) deleted up to 70; our marker is 40; region 1 needs 41..
    p = plan(
        [route(1), route(2)],
        [stat(1, 45), stat(2, 90)],
        pruned=40,
        offsets=PartitionOffsets(70, 100),
    )
    assert p.data_loss == (1,)
    assert reasons(p) == {1: RETENTION_OVERRUN}
    assert p.prune_point is None


# --- a registry snapshot ---------------------------------------------------------------


def test_a_registry_topic_snapshot_is_planned_as_the_stats_it_holds() -> None:
    stats = [stat(1, 60), stat(2, 20, latest=70), stat(3, 5, age=100.0), stat(4, 1, topic="x")]
    registry = RegionRegistry()
    report(registry, stats[3:])
    report(registry, stats[:3])
    routes = [route(i) for i in range(1, 6)]
    offsets = PartitionOffsets(3, 100)
    assert plan(routes, stats, offsets=offsets) == plan_topic(
        TOPIC,
        routes,
        registry.topic_snapshot(TOPIC),
        now=NOW,
        stat_ttl=TTL,
        pruned_entry_id=None,
        offsets=offsets,
    )


# --- properties ---------------------------------------------------------------------------

_region_case = st.tuples(
    st.booleans(),  # has a stat
    st.integers(min_value=-1, max_value=1000),  # flushed
    st.one_of(st.none(), st.integers(min_value=-1, max_value=1000)),  # topic latest
    st.floats(min_value=0.0, max_value=2 * TTL, allow_nan=False),  # age
)


@settings(max_examples=400, deadline=None)
@given(
    cases=st.lists(_region_case, min_size=0, max_size=12),
    offsets=st.one_of(
        st.none(),
        st.tuples(st.integers(0, 1000), st.integers(0, 1000)).map(
            lambda t: PartitionOffsets(min(t), max(t))
        ),
    ),
    pruned=st.one_of(st.none(), st.integers(0, 1000)),
)
def test_properties(
    cases: list[tuple[bool, int, int | None, float]],
    offsets: PartitionOffsets | None,
    pruned: int | None,
) -> None:
    routes = [route(i) for i in range(len(cases))]
    stats = [
        stat(i, flushed, latest, age=age)
        for i, (has, flushed, latest, age) in enumerate(cases)
        if has
    ]
    p = plan(routes, stats, pruned=pruned, offsets=offsets)
    by_id = {s.region_id: s for s in stats}
    # Routes as the topic-region map keeps them (region id -> route) plan the same.
    assert p == plan_topic(
        TOPIC,
        {r.region_id: r for r in routes},
        registry_of(stats).topic_snapshot(TOPIC),
        now=NOW,
        stat_ttl=TTL,
        pruned_entry_id=pruned,
        offsets=offsets,
    )

    # Invariant 8: a high watermark below the marker + 1, or a region that reported
    # entries above the high watermark - 1, is a topic reset: no P, the regions named.
    hwm = None if offsets is None else offsets.high_watermark
    below_marker = hwm is not None and pruned is not None and hwm < pruned + 1
    ahead = [
        i
        for i in range(len(cases))
        if hwm is not None and i in by_id and by_id[i].prunable_entry_id > hwm - 1
    ]
    if below_marker or ahead:
        assert p.topic_reset is not None
        concerned = list(range(len(cases))) if below_marker else ahead
        assert [(b.region_id, b.reason) for b in p.blocked_by] == [
            (i, TOPIC_RESET) for i in concerned
        ]
        assert p.prune_point is None and p.reclaimable_entries == 0 and p.data_loss == ()
        assert nothing_to_cut(p) is not None
        return
    assert p.topic_reset is None

    # The rules region by region: every blocker named once, in the map's order, with
    # its reason; data loss only for a fresh stat below Kafka's log start.
    expected: list[tuple[int, str]] = []
    for i in range(len(cases)):
        s = by_id.get(i)
        need = None if s is None else max(s.prunable_entry_id, -1 if pruned is None else pruned)
        if s is None:
            expected.append((i, NO_STAT))
        elif NOW - s.received_at > TTL:
            expected.append((i, STALE_STAT))
        elif need is not None and offsets is not None and offsets.log_start_offset > need + 1:
            expected.append((i, RETENTION_OVERRUN))
    assert [(b.region_id, b.reason) for b in p.blocked_by] == expected
    assert list(p.data_loss) == [i for i, reason in expected if reason == RETENTION_OVERRUN]
    expected_blocked = {i for i, _ in expected}

    if not cases or expected_blocked:
        assert p.prune_point is None
        assert p.reclaimable_entries == 0
        return
    assert p.prune_point is not None
    # Invariant 1: the cut never passes an entry any mapped region still needs; a region's
    # need starts above max(prunable, marker), since replay starts there.
    marker = -1 if pruned is None else pruned
    needs = [max(s.prunable_entry_id, marker) for s in stats]
    for need in needs:
        assert p.prune_point <= need
    # No report is above the high watermark - 1 (else a reset), so nothing is clamped.
    assert p.prune_point == max(min(needs), -1)
    # Invariant 6, and the marker never names an entry not written yet.
    if offsets is not None:
        assert p.prune_point <= max(offsets.high_watermark - 1, -1)
        assert p.reclaimable_entries == max(0, p.prune_point - offsets.log_start_offset)
    assert p.prune_point >= -1
    assert p.reclaimable_entries >= 0


def _planned(prune_point: int, pruned: int | None, log_start: int) -> TopicPlan:
    return TopicPlan(
        topic="t",
        prune_point=prune_point,
        pruned_entry_id=pruned,
        log_start_offset=log_start,
        high_watermark=100,
        blocked_by=(),
        reclaimable_entries=max(0, prune_point - log_start),
        data_loss=(),
        region_count=1,
    )


def test_a_marker_ahead_of_kafkas_log_start_is_work_for_a_physical_purge() -> None:
    lagging = _planned(40, pruned=40, log_start=0)
    assert nothing_to_cut(lagging) is None
    reason = nothing_to_cut(lagging, logical_delete=True)
    assert reason is not None and reason.startswith("up to date")


def test_a_marker_kafka_has_caught_up_with_is_up_to_date() -> None:
    reason = nothing_to_cut(_planned(40, pruned=40, log_start=40))
    assert reason is not None and reason.startswith("up to date")
    assert nothing_to_cut(_planned(41, pruned=40, log_start=40)) is None
    assert nothing_to_cut(_planned(-1, pruned=None, log_start=0)) is not None
