"""The purge's decisions (procedures/wal_purge/_plan.py): pure functions of one snapshot,
cases plus properties.

Plans come from the real `plan_topic` over random small worlds (regions' stats, the
marker, Kafka's offsets), so the properties hold for what the procedure actually meets.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metasrv.errors import TopicReset
from metasrv.keys import Marker, ResetLatch
from metasrv.model import PartitionOffsets, RegionStat, TopicPlan
from procedures.wal_purge import (
    TOPIC_RESET,
    Advance,
    CatchUp,
    Cut,
    Flush,
    FlushTarget,
    Lost,
    Reset,
    Skip,
    Wait,
    advanced_marker,
    decide_after_flush,
    decide_prepare,
    decide_purge,
    flush_deadline,
    nothing_to_cut,
    plan_topic,
    reset_marker,
)
from tests.procedures.wal_purge.test_prune_plan import NOW, TOPIC, TTL, registry_of, route, stat


def plan_of(
    stats: list[RegionStat],
    *,
    regions: int | None = None,
    marker: Marker | None = None,
    offsets: PartitionOffsets | None = None,
) -> TopicPlan:
    count = len(stats) if regions is None else regions
    return plan_topic(
        TOPIC,
        [route(i) for i in range(1, count + 1)],
        registry_of(stats).topic_snapshot(TOPIC),
        now=NOW,
        stat_ttl=TTL,
        pruned_entry_id=None if marker is None else marker.pruned_entry_id,
        offsets=offsets,
        marker=marker,
        offsets_asked_at=NOW,
    )


TARGET = FlushTarget(region_id=1, node_id=1, prunable_entry_id=5, replay_bytes=10_000)


# --- the case of issue #34: a recreated topic ------------------------------------------


def test_a_recreated_topic_is_a_reset_at_every_step() -> None:
    # Marker 60 on the old topic; the new one holds 0..29; the region reports flushed 60.
    plan = plan_of([stat(1, 60)], marker=Marker(60), offsets=PartitionOffsets(0, 30))
    assert plan.topic_reset is not None and plan.topic_reset.startswith(
        "high_watermark_below_marker"
    )
    assert plan.prune_point is None and plan.reclaimable_entries == 0
    assert [(b.region_id, b.reason) for b in plan.blocked_by] == [(1, TOPIC_RESET)]
    # ef11397 clamped P to 29 and called "marker ahead of log start" work.
    assert nothing_to_cut(plan) is not None
    assert isinstance(decide_prepare(plan, [], logical_delete=False), Reset)
    assert isinstance(decide_after_flush(plan, planned_topic_id=None, logical_delete=False), Reset)
    for target in (29, 60):
        decision = decide_purge(target, plan, planned_topic_id=None, logical_delete=False)
        assert isinstance(decision, Reset), decision
        assert decision.high_watermark == 30 and decision.regions == (1,)


def test_a_topic_id_other_than_the_markers_is_a_reset() -> None:
    offsets = PartitionOffsets(0, 100, topic_id="new")
    plan = plan_of([stat(1, 60)], marker=Marker(50, topic_id="old"), offsets=offsets)
    assert plan.topic_reset is not None and plan.topic_reset.startswith("topic_id_changed")
    decision = decide_purge(50, plan, planned_topic_id=None, logical_delete=False)
    assert isinstance(decision, Reset) and decision.topic_id == "new"
    # The same id, or an id not known on either side, is no reset.
    for marker, kafka_id in ((Marker(50, "new"), "new"), (Marker(50), "new"), (Marker(50), None)):
        same = plan_of([stat(1, 60)], marker=marker, offsets=PartitionOffsets(0, 100, kafka_id))
        assert same.topic_reset is None and same.prune_point == 60
        assert same.topic_id == kafka_id


def test_a_topic_recreated_during_its_first_purge_is_a_reset() -> None:
    # Issue #34, found by the protocol model: prepare planned P=1 on topic id "old" (the
    # region flushed 1 and reported it; no marker yet, so none records an id). The topic
    # was deleted and recreated and the region wrote 0 and 1 again: the fresh plan sees
    # nothing wrong (no marker, the report 1 <= the high watermark 2 - 1), and advancing
    # to 1 would delete the new entry 0, which the region has not flushed.
    recreated = PartitionOffsets(0, 2, topic_id="new")
    plan = plan_of([stat(1, 1)], offsets=recreated)
    assert plan.topic_reset is None and plan.prune_point == 1
    assert decide_purge(1, plan, planned_topic_id=None, logical_delete=False) == Advance(1)
    decision = decide_purge(1, plan, planned_topic_id="old", logical_delete=False)
    assert decision == Reset(
        reason="topic_id_changed: Kafka's topic id new is not the old the purge planned on",
        regions=(),
        topic_id="new",
        high_watermark=2,
    )
    # The flush step's fresh plan is checked the same way (a purge that ends there
    # without a reset would leave the next one to plan the old reports on the new topic).
    assert decide_after_flush(plan, planned_topic_id="old", logical_delete=False) == decision
    assert decide_after_flush(plan, planned_topic_id="new", logical_delete=False) == Cut(1)
    # Checked before the marker: one at the target (recording the new id) is no catch-up.
    caught = plan_of([stat(1, 1)], marker=Marker(1, "new"), offsets=recreated)
    assert decide_purge(1, caught, planned_topic_id="new", logical_delete=True) == CatchUp(1)
    reset = decide_purge(1, caught, planned_topic_id="old", logical_delete=True)
    assert isinstance(reset, Reset) and reset.reason.startswith("topic_id_changed")
    # The same id, or none known on either side (a record persisted before ids), is no reset.
    assert decide_purge(1, plan, planned_topic_id="new", logical_delete=False) == Advance(1)
    unknown = plan_of([stat(1, 1)], offsets=PartitionOffsets(0, 2))
    assert decide_purge(1, unknown, planned_topic_id=None, logical_delete=False) == Advance(1)
    # Kafka gave no id now (DescribeTopics slow) and prepare had one: wait, whatever the
    # marker says, until the check can be made.
    waiting = decide_purge(1, unknown, planned_topic_id="old", logical_delete=False)
    assert isinstance(waiting, Wait) and "no topic id" in waiting.reason
    at_target = plan_of([stat(1, 1)], marker=Marker(1), offsets=PartitionOffsets(0, 2))
    assert isinstance(
        decide_purge(1, at_target, planned_topic_id="old", logical_delete=False), Wait
    )
    assert decide_purge(1, at_target, planned_topic_id=None, logical_delete=False) == CatchUp(1)


def test_no_cut_while_kafka_gives_no_id_and_the_marker_records_one() -> None:
    # A topic recreated and written past the marker passes every other check: without
    # Kafka's id the plan names no cut, and the purge step waits instead of deleting.
    unverified = plan_of(
        [stat(1, 60)], marker=Marker(50, topic_id="old"), offsets=PartitionOffsets(0, 100)
    )
    assert unverified.prune_point is None and unverified.topic_reset is None
    assert unverified.kafka_unavailable is not None
    assert isinstance(decide_prepare(unverified, [], logical_delete=False), Skip)
    assert isinstance(
        decide_purge(55, unverified, planned_topic_id=None, logical_delete=False), Wait
    )
    # A marker without an id (written before ids were recorded) is planned as before.
    legacy = plan_of([stat(1, 60)], marker=Marker(50), offsets=PartitionOffsets(0, 100))
    assert legacy.prune_point == 60 and legacy.kafka_unavailable is None


def test_a_latched_reset_stays_whatever_kafka_shows() -> None:
    latched = Marker(60, "id", ResetLatch("topic_missing"))
    plan = plan_of([stat(1, 90)], marker=latched, offsets=PartitionOffsets(0, 100, "id"))
    assert plan.topic_reset == "latched: topic_missing"
    assert isinstance(decide_prepare(plan, [TARGET], logical_delete=False), Reset)
    # Without Kafka's offsets too (the ticker's view of a topic Kafka lost).
    assert plan_of([stat(1, 90)], marker=latched).topic_reset == "latched: topic_missing"


def test_only_stats_received_before_kafka_was_asked_are_compared() -> None:
    routes = [route(1)]
    rows = registry_of([stat(1, 50, age=1.0)]).topic_snapshot(TOPIC)  # received at NOW - 1
    offsets = PartitionOffsets(0, 40)
    before = plan_topic(
        TOPIC, routes, rows, now=NOW, stat_ttl=TTL, pruned_entry_id=None, offsets=offsets,
        offsets_asked_at=NOW - 2,
    )  # fmt: skip
    assert before.topic_reset is None and before.prune_point == 39
    after = plan_topic(
        TOPIC, routes, rows, now=NOW, stat_ttl=TTL, pruned_entry_id=None, offsets=offsets,
        offsets_asked_at=NOW,
    )  # fmt: skip
    assert after.topic_reset is not None and after.topic_reset.startswith(
        "regions_ahead_of_high_watermark"
    )


# --- prepare and after-flush ------------------------------------------------------------


def test_prepare_decisions() -> None:
    offsets = PartitionOffsets(0, 100)
    lossy = plan_of([stat(1, 10), stat(2, 50)], offsets=PartitionOffsets(30, 100))
    assert decide_prepare(lossy, [TARGET], logical_delete=False) == Lost((1,), 30)
    blocked = plan_of([stat(1, 10)], regions=2, offsets=offsets)
    decision = decide_prepare(blocked, [TARGET], logical_delete=False)
    assert isinstance(decision, Skip) and "2 (no_stat)" in decision.reason
    ready = plan_of([stat(1, 10), stat(2, 50)], offsets=offsets)
    assert decide_prepare(ready, [], logical_delete=False) == Cut(10)
    assert decide_prepare(ready, [TARGET], logical_delete=False) == Flush(10, (TARGET,))
    # Up to date, yet a region far behind is asked to flush rather than the topic skipped.
    current = plan_of([stat(1, 10)], marker=Marker(10), offsets=PartitionOffsets(10, 100))
    skipped = decide_prepare(current, [], logical_delete=False)
    assert isinstance(skipped, Skip) and skipped.reason.startswith("up to date")
    assert decide_prepare(current, [TARGET], logical_delete=False) == Flush(10, (TARGET,))
    # A marker ahead of the log start is work for a physical purge only.
    behind = plan_of([stat(1, 10)], marker=Marker(10), offsets=PartitionOffsets(0, 100))
    assert decide_prepare(behind, [], logical_delete=False) == Cut(10)
    assert isinstance(decide_prepare(behind, [], logical_delete=True), Skip)


def test_after_flush_decisions() -> None:
    offsets = PartitionOffsets(0, 100)
    assert decide_after_flush(
        plan_of([stat(1, 40)], offsets=offsets), planned_topic_id=None, logical_delete=False
    ) == (Cut(40))
    blocked = plan_of([stat(1, 40, age=2 * TTL)], offsets=offsets)
    assert isinstance(
        decide_after_flush(blocked, planned_topic_id=None, logical_delete=False), Skip
    )
    nothing = plan_of([stat(1, -1)], offsets=offsets)
    assert isinstance(
        decide_after_flush(nothing, planned_topic_id=None, logical_delete=False), Skip
    )


# --- the purge step ---------------------------------------------------------------------


def test_purge_decisions() -> None:
    offsets = PartitionOffsets(0, 100)
    fresh = plan_of([stat(1, 40), stat(2, 60)], marker=Marker(10), offsets=offsets)
    assert decide_purge(40, fresh, planned_topic_id=None, logical_delete=False) == Advance(40)
    assert decide_purge(30, fresh, planned_topic_id=None, logical_delete=False) == Advance(30)
    # A region registered meanwhile lowers P: the target follows it down.
    lowered = plan_of([stat(1, 40), stat(2, 60), stat(3, 25)], marker=Marker(10), offsets=offsets)
    assert decide_purge(40, lowered, planned_topic_id=None, logical_delete=False) == Advance(
        25, lowered=True
    )
    at_marker = plan_of([stat(1, 40), stat(2, 5)], marker=Marker(10), offsets=offsets)
    assert isinstance(
        decide_purge(40, at_marker, planned_topic_id=None, logical_delete=False), Skip
    )
    # After a leader change nothing has reported: wait, never trust the old target.
    empty = plan_of([], regions=2, marker=Marker(10), offsets=offsets)
    waiting = decide_purge(40, empty, planned_topic_id=None, logical_delete=False)
    assert isinstance(waiting, Wait) and waiting.regions == (1, 2)
    # The marker already at the target (a resumed purge): only Kafka's deletion is left,
    # with or without stats.
    done = plan_of([], regions=2, marker=Marker(40), offsets=offsets)
    assert decide_purge(40, done, planned_topic_id=None, logical_delete=False) == CatchUp(40)
    # Retention deleted what a region needs: loss, nothing moves.
    lossy = plan_of(
        [stat(1, 40), stat(2, 20)], marker=Marker(10), offsets=PartitionOffsets(30, 100)
    )
    assert decide_purge(40, lossy, planned_topic_id=None, logical_delete=False) == Lost((2,), 30)
    # The high watermark fell below the target since it was planned (at most hwm - 1).
    fallen = plan_of([stat(1, 5)], offsets=PartitionOffsets(0, 20))
    below = decide_purge(40, fallen, planned_topic_id=None, logical_delete=False)
    assert isinstance(below, Reset) and below.reason.startswith("high_watermark_below_target")
    # No offsets: wait.
    assert isinstance(
        decide_purge(40, plan_of([stat(1, 40)]), planned_topic_id=None, logical_delete=False), Wait
    )


# --- properties -------------------------------------------------------------------------

_report = st.tuples(
    st.integers(min_value=-1, max_value=60),  # flushed
    st.integers(0, 9).map(lambda n: 2 * TTL if n == 5 else 1.0),  # age: mostly fresh
    st.integers(0, 7),  # 3: no stat
)


@st.composite
def _worlds(draw: st.DrawFn) -> tuple[TopicPlan, int]:
    reports = draw(
        st.lists(_report.map(lambda r: None if r[2] == 0 else r[:2]), min_size=1, max_size=3)
    )
    stats = [
        stat(i, flushed, age=age)
        for i, r in enumerate(reports, start=1)
        if r is not None
        for flushed, age in [r]
    ]
    pruned = draw(st.one_of(st.none(), st.integers(-1, 60)))
    marker_id = draw(st.sampled_from([None, "a", "a", "b"]))
    latch = draw(st.sampled_from([None, None, None, ResetLatch("topic_missing")]))
    marker = draw(st.sampled_from([None, Marker(pruned, marker_id, latch)]))
    log_start, high = sorted(draw(st.tuples(st.integers(0, 70), st.integers(0, 70))))
    kafka_id = draw(st.sampled_from([None, "a", "a", "b"]))
    offsets = None if draw(st.integers(0, 9)) == 5 else PartitionOffsets(log_start, high, kafka_id)
    target = draw(st.integers(-1, 70))
    if draw(st.booleans()) and high > 0:  # often a target the plan could have named
        target = draw(st.integers(-1, high - 1))
    return plan_of(stats, regions=len(reports), marker=marker, offsets=offsets), target


@settings(max_examples=1000, deadline=None)
@given(world=_worlds(), logical=st.booleans(), planned=st.sampled_from([None, "a", "a", "a", "b"]))
def test_purge_decision_properties(
    world: tuple[TopicPlan, int], logical: bool, planned: str | None
) -> None:
    plan, target = world
    decision = decide_purge(target, plan, planned_topic_id=planned, logical_delete=logical)
    marker = plan.pruned_entry_id
    hwm = plan.high_watermark
    if plan.topic_reset is not None:
        # Invariant 8: a reset topic is never cut, whatever the target.
        assert isinstance(decision, Reset)
        return
    if planned is not None and plan.topic_id is not None and plan.topic_id != planned:
        # Not the topic prepare planned on: a reset, whatever the marker says.
        assert isinstance(decision, Reset) and decision.reason.startswith("topic_id_changed")
        assert decision.topic_id == plan.topic_id
        return
    if planned is not None and plan.topic_id is None:
        # Which topic this is cannot be checked: nothing moves, nothing is deleted.
        assert isinstance(decision, Wait)
        return
    if isinstance(decision, Advance):
        # Invariants 1 and 6: never past what every mapped region allows, nor past the
        # latest written entry; the marker only moves forward (5).
        assert plan.prune_point is not None and decision.target <= plan.prune_point
        assert hwm is not None and decision.target <= hwm - 1
        assert marker is None or decision.target > marker
        assert not plan.data_loss and not plan.blocked_by
        assert decision.lowered == (decision.target < target)
        assert decision.target <= target
    elif isinstance(decision, CatchUp):
        # Deleting below a committed marker: nobody replays below it.
        assert marker is not None and marker >= decision.target == target
        assert hwm is not None and target <= hwm
    elif isinstance(decision, Lost):
        assert decision.regions == plan.data_loss != ()
    elif isinstance(decision, Wait):
        assert plan.prune_point is None or hwm is None
    elif isinstance(decision, Skip):
        p = plan.prune_point
        assert p is not None and (p < 0 or (marker is not None and p <= marker))
    else:
        assert isinstance(decision, Reset)
        assert hwm is not None and hwm < target


@settings(max_examples=400, deadline=None)
@given(world=_worlds(), logical=st.booleans(), flush=st.booleans())
def test_prepare_and_after_flush_properties(
    world: tuple[TopicPlan, int], logical: bool, flush: bool
) -> None:
    plan, _ = world
    targets = [TARGET] if flush else []
    first = decide_prepare(plan, targets, logical_delete=logical)
    then = decide_after_flush(plan, planned_topic_id=None, logical_delete=logical)
    for decision in (first, then):
        if plan.topic_reset is not None:
            assert isinstance(decision, Reset)
        elif plan.data_loss:
            assert decision == Lost(plan.data_loss, plan.log_start_offset)
        elif plan.prune_point is None:
            assert isinstance(decision, Skip)
        else:
            # Go on only with the plan's own P: the dry run and the purge agree.
            assert isinstance(decision, Skip | Cut | Flush)
            if isinstance(decision, Cut | Flush):
                assert decision.prune_point == plan.prune_point
    if isinstance(then, Cut):
        assert nothing_to_cut(plan, logical_delete=logical) is None


# --- markers and the flush deadline -----------------------------------------------------


@given(
    before=st.one_of(st.none(), st.integers(-1, 100)),
    target=st.integers(0, 100),
    stored_id=st.sampled_from([None, "a"]),
    kafka_id=st.sampled_from([None, "a", "b"]),
)
def test_advanced_marker_is_monotonic_and_records_the_topic_id(
    before: int | None, target: int, stored_id: str | None, kafka_id: str | None
) -> None:
    marker = Marker(before, stored_id)
    if stored_id is not None and kafka_id is not None and stored_id != kafka_id:
        with pytest.raises(TopicReset):
            advanced_marker(marker, target, kafka_id)
        return
    new = advanced_marker(marker, target, kafka_id)
    if before is not None and before >= target:
        assert new is None
    else:
        assert new == Marker(target, kafka_id if kafka_id is not None else stored_id, None)


def test_a_marker_never_moves_on_a_latched_reset() -> None:
    with pytest.raises(TopicReset):
        advanced_marker(Marker(10, "a", ResetLatch("topic_missing")), 20, "a")


def test_reset_marker_keeps_the_entry_id_and_the_first_latch() -> None:
    reset = Reset("high_watermark_below_marker: x", (1,), "b", 30)
    assert reset_marker(Marker(60, "a"), reset) == Marker(
        60, "a", ResetLatch("high_watermark_below_marker: x", "b", 30)
    )
    assert reset_marker(None, reset) == Marker(None, None, ResetLatch(reset.reason, "b", 30))
    assert reset_marker(Marker(60, "a", ResetLatch("first")), reset) is None


@given(
    timeout=st.floats(0.0, 120.0),
    skew=st.floats(-1e6, 1e6),  # wall clock now minus the persisted send time
    mono=st.floats(0.0, 1e6),
)
def test_the_flush_deadline_never_exceeds_the_timeout(
    timeout: float, skew: float, mono: float
) -> None:
    sent_at = 1.7e9
    deadline = flush_deadline(sent_at, timeout, wall_now=sent_at + skew, mono_now=mono)
    assert mono <= deadline <= mono + timeout
    if skew <= 0:  # just sent, or the clock stepped back since: the whole timeout
        assert deadline == pytest.approx(mono + timeout, abs=1e-3)
    else:  # a resume: only what is left of it
        assert deadline == pytest.approx(mono + max(0.0, timeout - skew), abs=1e-3)


def test_the_many_topic_view_skips_only_the_report_comparison() -> None:
    # gather_plans (the ticker's and the API's view) does not scan every report against
    # the high watermark; the offsets' own rules and a latched reset still apply.
    rows = registry_of([stat(1, 50)]).topic_snapshot(TOPIC)

    def view(marker: Marker | None, offsets: PartitionOffsets) -> TopicPlan:
        return plan_topic(
            TOPIC, [route(1)], rows, now=NOW, stat_ttl=TTL, offsets=offsets, marker=marker,
            pruned_entry_id=None if marker is None else marker.pruned_entry_id,
            offsets_asked_at=NOW, compare_reports=False,
        )  # fmt: skip

    assert view(None, PartitionOffsets(0, 40)).topic_reset is None
    below = view(Marker(45), PartitionOffsets(0, 40)).topic_reset
    assert below is not None and below.startswith("high_watermark_below_marker")
    latched = view(Marker(10, reset=ResetLatch("topic_missing")), PartitionOffsets(0, 40))
    assert latched.topic_reset == "latched: topic_missing"
    assert [(b.region_id, b.reason) for b in latched.blocked_by] == [(1, TOPIC_RESET)]
