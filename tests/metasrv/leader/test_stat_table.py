"""The region stat table behind `RegionRegistry`: rows as columns (topics, copies, the
per-datanode recall, prepared slots), driven as the product drives it: heartbeats'
columns judged and stored, regions named by id."""

from __future__ import annotations

import gc
from typing import NamedTuple

import numpy as np
import pytest

from metasrv.errors import InvalidArgument
from metasrv.leader import (
    NULL,
    HeartbeatJudge,
    Judged,
    RegionRegistry,
    StatRow,
    regresses,
    row_of,
)
from metasrv.model import RegionRoute, RegionStat
from metasrv.wire import Columns
from tests._gc import tracked_reachable
from tests._stats import Routes, prepared_for, report


def stat(
    region_id: int, flushed: int, topic: str = "a", *, node: int = 1, at: float = 1.0
) -> RegionStat:
    return RegionStat(region_id, node, topic, flushed, None, 0, 3, at)


def row(flushed: int, topic: str = "a", *, node: int = 1, at: float = 1.0) -> StatRow:
    return StatRow(node, topic, flushed, None, 0, 3, at, flushed)


def columns(
    ids: list[int],
    topics: list[str] | str = "a",
    flushed: list[int] | int = 5,
    manifest: list[int | None] | None = None,
    names: list[str] | None = None,
) -> Columns:
    """A heartbeat's regions; `names`: the heartbeat's topic names (default: the used
    ones)."""
    n = len(ids)
    listed = [topics] * n if isinstance(topics, str) else topics
    names = names or list(dict.fromkeys(listed))
    flushed_ids = [flushed] * n if isinstance(flushed, int) else flushed
    return Columns(
        topic_names=names,
        topic=np.array([names.index(t) for t in listed], np.int64),
        region_id=np.array(ids, np.int64),
        flushed=np.array(flushed_ids, np.int64),
        memtable=np.zeros(n, np.int64),
        latest=None,
        manifest=(
            np.full(n, 3, np.int64)
            if manifest is None
            else np.array([NULL if m is None else m for m in manifest], np.int64)
        ),
    )


def trusting(region_ids: list[int], topic: str = "a") -> Routes:
    """Routes of regions on `topic` whose node is unknown (-1): any datanode is trusted."""
    return Routes({r: RegionRoute(r, topic, -1, None) for r in region_ids})


def beat(registry: RegionRegistry, node: int, cols: Columns, routes: Routes, at: float) -> Judged:
    """One heartbeat judged and stored; its outcome."""
    judged = HeartbeatJudge(registry, routes, keep_misrouted=False).columns(node, cols, at)
    judged.store(at)
    return judged


def rows_by_topic(registry: RegionRegistry) -> dict[str, dict[int, StatRow]]:
    return {t: dict(registry.topic_snapshot(t).items()) for t in registry.topics()}


def slot_order(registry: RegionRegistry) -> list[int]:
    """The region ids in the order the table stores their rows."""
    return [rid for cols in registry.row_slices(1 << 20) for rid in cols.ids.tolist()]


def test_rows_read_back_as_reported_with_nulls_kept() -> None:
    registry = RegionRegistry()
    report(
        registry,
        [
            stat(1, 5),
            RegionStat(2, 2, "a", 7, 9, 0, None, 2.5),
            stat(3, 6, "b"),
            *(stat(r, r, "c") for r in range(10, 1510)),  # past the first capacity
        ],
    )
    assert len(registry) == 1503 and 2 in registry and 4 not in registry
    assert dict(registry.topic_snapshot("a").items()) == {
        1: row(5),
        2: StatRow(2, "a", 7, 9, 0, None, 2.5, 9),
    }
    assert registry.topic_snapshot("b")[3] == row(6, "b")
    (copied,) = registry.row_slices(1 << 20)
    latest = dict(zip(copied.ids.tolist(), copied.latest.tolist(), strict=True))
    assert (latest[1], latest[2], latest[3]) == (NULL, 9, NULL)  # None stored as NULL
    assert registry.topic_snapshot("c")[1509] == row(1509, "c")


def test_a_row_moves_between_topics_and_a_discarded_slot_is_reused() -> None:
    registry = RegionRegistry()
    report(registry, [stat(1, 5), stat(2, 5), stat(5, 5)])
    report(registry, [stat(1, 6, "b")])  # moved: its route names b now
    assert slot_order(registry) == [1, 2, 5]  # moved in place
    assert sorted(registry.topic_snapshot("a")) == [2, 5]
    assert sorted(registry.topic_snapshot("b")) == [1]
    registry.discard(2)
    registry.discard(5)
    assert registry.topics() == ["b"] and len(registry.topic_snapshot("a")) == 0
    report(registry, [stat(3, 1, "c"), stat(4, 1, "c")])
    assert slot_order(registry) == [1, 4, 3]  # the freed slots, the last freed first
    registry.discard(99)  # no row: nothing happens
    assert len(registry) == 3


def test_a_steady_heartbeat_overwrites_whole_columns_in_place() -> None:
    registry = RegionRegistry()
    report(registry, [stat(r, r) for r in (1, 2, 3)])
    cols = columns([3, 1], flushed=[30, 10], manifest=[5, None])
    judged = beat(registry, 1, cols, Routes({}), 7.0)
    assert judged.verdict is not None and judged.verdict.steady.all()
    snapshot = registry.topic_snapshot("a")
    assert snapshot[3] == StatRow(1, "a", 30, None, 0, 5, 7.0, 30)
    assert snapshot[1] == StatRow(1, "a", 10, None, 0, None, 7.0, 10)
    assert snapshot[2] == row(2)


def test_lowest_prunable_is_none_when_a_row_is_stale_or_there_are_none() -> None:
    registry = RegionRegistry()
    assert registry.topic_snapshot("a").lowest_prunable(0.0) is None
    report(registry, [stat(1, 5, at=10.0), stat(2, 3, at=20.0), stat(3, 1, "b", at=0.0)])
    assert registry.topic_snapshot("a").lowest_prunable(10.0) == 3  # b's stale row: not a's
    assert registry.topic_snapshot("a").lowest_prunable(15.0) is None


def test_the_same_ids_in_order_are_recalled_until_a_row_is_discarded() -> None:
    registry = RegionRegistry()
    report(registry, [stat(r, r, node=7) for r in (1, 2, 3)])
    registry.judge(7, columns([3, 1, 2])).remember()
    assert registry.judge(7, columns([3, 1, 2])).recalled
    assert not registry.judge(7, columns([1, 3, 2])).recalled  # another order
    assert not registry.judge(8, columns([3, 1, 2])).recalled  # another datanode
    report(registry, [stat(4, 4, node=9)])  # a new row moves no slot
    assert registry.judge(7, columns([3, 1, 2])).recalled
    registry.discard(4)  # a freed slot may be handed to another region
    assert not registry.judge(7, columns([3, 1, 2])).recalled


def test_remembered_regions_stay_within_twice_the_rows() -> None:
    registry = RegionRegistry()
    ids = list(range(100))
    report(registry, [stat(r, r) for r in ids])
    for node in range(50):  # 50 invented datanodes each naming every region
        registry.judge(node, columns(ids)).remember()
    kept = [node for node in range(50) if registry.judge(node, columns(ids)).recalled]
    assert kept == [48, 49]  # 200 ids at most: the newest two lists


def test_nothing_in_the_table_is_tracked_by_the_gc() -> None:
    # A full collection must not walk a million rows: it visits the same few containers
    # whatever the table holds.
    small, large = RegionRegistry(), RegionRegistry()
    for registry, n in ((small, 10), (large, 1000)):
        report(registry, [stat(r, r, f"t{r % 7}") for r in range(n)])
        cols = columns(list(range(n)), [f"t{r % 7}" for r in range(n)], 10**6)
        for _ in range(2):  # the datanode's list remembered, then recalled
            beat(registry, 1, cols, Routes({}), 2.0)
        assert len(registry.topic_snapshot("t1")) == n // 7 + (n % 7 > 1)
    gc.collect()  # tuples of arrays only (a topic's rows sorted out) are untracked by one
    assert tracked_reachable(large) == tracked_reachable(small) < 25


def test_new_rows_reuse_free_slots_and_moved_rows_keep_theirs() -> None:
    registry = RegionRegistry()
    report(registry, [stat(r, r, f"t{r % 2}") for r in range(6)])
    registry.discard(1)
    registry.discard(4)
    report(
        registry,
        [
            stat(0, 10, "t1"),  # moves from t0
            RegionStat(7, 3, "t2", 5, 6, 0, None, 2.0),
            stat(8, 8, "t0"),
            stat(9, 9, "t0"),
            stat(10, 11, "t3"),  # more new rows than free slots: the table grows
        ],
    )
    assert rows_by_topic(registry) == {
        "t0": {2: row(2, "t0"), 8: row(8, "t0"), 9: row(9, "t0")},
        "t1": {0: row(10, "t1"), 3: row(3, "t1"), 5: row(5, "t1")},
        "t2": {7: StatRow(3, "t2", 5, 6, 0, None, 2.0, 6)},
        "t3": {10: row(11, "t3")},
    }
    # 8 and 9 in the slots 4 and 1 freed (the last freed first), 10 and 7 at the end.
    assert slot_order(registry) == [0, 9, 2, 3, 8, 5, 10, 7]


def test_rows_of_reads_a_topics_rows_in_order_with_none_for_the_others() -> None:
    registry = RegionRegistry()
    report(registry, [stat(1, 5), stat(2, 6, "b"), stat(3, 7)])
    rows = registry.topic_snapshot("a")
    assert rows.rows_of([3, 2, 1, 9]) == [row(7), None, row(5), None]
    assert rows.rows_of([1, 3]) == [row(5), row(7)]
    assert rows.rows_of([]) == []


def test_reserve_keeps_the_rows() -> None:
    registry = RegionRegistry()
    report(registry, [stat(1, 5)])
    registry.reserve(1000)
    report(registry, [stat(r, r) for r in range(2, 1001)])
    registry.reserve(10)  # never shrinks
    assert registry.get(1) == stat(1, 5) and registry.topic_snapshot("a")[1000] == row(1000)


def test_the_verdict_is_regresses_a_column_at_a_time() -> None:
    registry = RegionRegistry()
    report(
        registry,
        [
            RegionStat(1, 1, "a", 10, None, 0, 5, 1.0),
            RegionStat(2, 1, "a", 10, None, 0, None, 1.0),
            RegionStat(3, 1, "b", 10, None, 0, 5, 1.0),
        ],
    )
    # Per region: (region, reported topic, flushed, manifest).
    reports: list[tuple[int, str, int, int | None]] = [
        (1, "a", 11, 5),  # forward
        (1, "a", 9, 5),  # backwards at the same manifest: regressed
        (1, "a", 9, 6),  # backwards at a newer manifest: regressed
        (1, "a", 9, 4),  # re-created (a lower manifest): the truth
        (1, "a", 9, None),  # no manifest to tell: regressed
        (2, "a", 9, 4),  # stored without a manifest: regressed
        (3, "a", 11, 5),  # its row names another topic
        (4, "a", 11, 5),  # no row
        (1, "zzz", 11, 5),  # a topic no row ever named
    ]
    verdict = registry.judge(
        1,
        columns(
            [r[0] for r in reports],
            [r[1] for r in reports],
            [r[2] for r in reports],
            [r[3] for r in reports],
        ),
    )
    assert not verdict.distinct  # region 1 many times: the judge refuses it
    for i, (rid, topic, flushed, manifest) in enumerate(reports):
        old = registry.get(rid, topic)
        expected = old is not None and regresses(row_of(old), flushed, manifest)
        assert bool(verdict.regressed[i]) == expected, reports[i]
        assert bool(verdict.steady[i]) == (old is not None and not expected), reports[i]
    assert verdict.steady.tolist() == [True, False, False, True, False, False, False, False, False]
    # Without a manifest column, every reported manifest is null.
    no_manifest = Columns(
        ["a"], np.array([0]), np.array([1]), np.array([9]), np.zeros(1, np.int64), None, None
    )
    assert registry.judge(1, no_manifest).regressed.tolist() == [True]


def test_a_stored_heartbeat_dirties_rows_whose_prunable_id_or_node_changed() -> None:
    registry = RegionRegistry()
    report(registry, [stat(1, 5), stat(2, 6)])
    dirty = registry.dirty_rows()

    def dirtied(node: int, flushed: list[int], at: float) -> list[int]:
        judged = beat(registry, node, columns([1, 2], flushed=flushed), trusting([1, 2]), at)
        assert judged.verdict is not None and not judged.rejected
        dirty.mark_judged(judged.verdict)
        return sorted(dirty.take().next_batch(10))

    assert dirtied(1, [5, 6], 2.0) == []
    assert dirtied(1, [5, 7], 3.0) == [2]
    assert dirtied(2, [5, 7], 4.0) == [1, 2]  # another node: both rows move to it
    judge = HeartbeatJudge(registry, trusting([1, 2, 9]), keep_misrouted=False)
    unstored = judge.columns(3, columns([1, 2, 9], flushed=9), 5.0).verdict
    assert unstored is not None
    dirty.mark_judged(unstored)  # judged, not stored: nothing changed (9 has no slot yet)
    assert len(dirty) == 0
    one, two = registry.get(1), registry.get(2)
    assert one is not None and (one.node_id, one.prunable_entry_id) == (2, 5)
    assert two is not None and (two.node_id, two.prunable_entry_id) == (2, 7)


def test_a_flushs_batches_skip_discarded_rows_and_a_failed_one_is_put_back() -> None:
    registry = RegionRegistry()
    report(registry, [stat(r, 10 * r) for r in range(1, 6)])
    dirty = registry.dirty_rows()
    dirty.mark([1, 2, 3, 4, 5, 99])  # 99 has no row
    assert len(dirty) == 5
    registry.discard(2)
    pending = dirty.take()
    assert len(dirty) == 0 and len(pending) == 5
    assert pending.next_batch(2) == {1: (1, 10)}  # 2's row is gone
    assert pending.next_batch(2) == {3: (1, 30), 4: (1, 40)}
    pending.put_back()  # that batch was not written: 3, 4 and 5 wait for the next flush
    assert len(pending) == 0 and len(dirty) == 3
    assert dirty.take().next_batch(10) == {3: (1, 30), 4: (1, 40), 5: (1, 50)}
    registry.clear()
    assert registry.dirty_rows(dirty) is not dirty  # a new term's rows: a new set
    fresh = registry.dirty_rows()
    assert registry.dirty_rows(fresh) is fresh


def test_a_heartbeat_names_topics_through_its_own_names_and_moves_rows() -> None:
    registry = RegionRegistry()
    cols = columns([5, 6, 7], ["y", "x", "y"], [1, 2, 3], names=["unused", "x", "y"])
    beat(registry, 3, cols, trusting([5, 7], "y"), 9.0)
    assert registry.get(6) is None  # unmapped
    mapped = {**trusting([5, 7], "y").routes, **trusting([6], "x").routes}
    beat(registry, 3, cols, Routes(mapped), 9.0)
    assert sorted(registry.topics()) == ["x", "y"]
    assert registry.topic_snapshot("x")[6] == StatRow(3, "x", 2, None, 0, 3, 9.0, 2)
    assert sorted(registry.topic_snapshot("y")) == [5, 7]
    verdict = registry.judge(3, columns([5, 6], "y", [1, 2]))
    assert verdict.steady.tolist() == [True, False]  # 6 names x
    before = slot_order(registry)
    beat(registry, 4, columns([6], "y", 2), trusting([6], "y"), 10.0)  # moved, in place
    assert slot_order(registry) == before and registry.topics() == ["y"]
    assert registry.topic_snapshot("y")[6] == StatRow(4, "y", 2, None, 0, 3, 10.0, 2)


def test_a_prepared_slot_is_not_a_row_until_its_region_reports() -> None:
    registry = RegionRegistry()
    assert registry.prepare([("a", [30, 10]), ("b", [20])]) == 3
    assert len(registry) == 0 and 10 not in registry and registry.get(10) is None
    assert registry.topics() == [] and len(registry.topic_snapshot("a")) == 0
    dirty = registry.dirty_rows()
    dirty.mark([10, 20])  # no row: no checkpoint to write
    assert slot_order(registry) == [] and len(dirty) == 0
    assert prepared_for(registry, "a", [10, 20, 30, 99]) == [10, 30]
    assert prepared_for(registry, "b", [10, 20, 30, 99]) == [20]
    # No row names any topic, not even one no row has named yet (code -1).
    verdict = registry.judge(7, columns([10, 20, 30, 99], ["zz", "a", "a", "a"]))
    assert not verdict.steady.any() and not verdict.regressed.any()
    assert verdict.prepared(np.arange(4)).tolist() == [False, False, True, False]

    judged = beat(registry, 7, columns([10, 20], ["a", "b"]), Routes({}), 1.0)
    assert judged.fresh is not None and len(judged.fresh) == 2  # the map's word
    assert len(registry) == 2 and prepared_for(registry, "a", [10, 20, 30]) == [30]
    assert prepared_for(registry, "b", [20]) == []
    assert registry.get(10) == RegionStat(10, 7, "a", 5, None, 0, 3, 1.0)
    assert sorted(registry.topic_snapshot("b")) == [20]
    dirty = registry.dirty_rows()
    dirty.mark([10, 30])  # 30 has no row: nothing to write for it
    assert dirty.take().next_batch(9) == {10: (7, 5)}
    registry.discard(30)  # prepared, never reported
    assert len(registry) == 2 and prepared_for(registry, "a", [30]) == []
    report(registry, [stat(30, 1)])  # back through the map
    assert len(registry) == 3 and sorted(registry.topic_snapshot("a")) == [10, 30]


def test_lookup_of_prepared_slots_agrees_with_the_index_through_discards_and_reuse() -> None:
    rng = np.random.default_rng(3)
    ids = rng.choice(10**9, 400, replace=False).tolist()
    prepared, plain = RegionRegistry(), RegionRegistry()
    prepared.prepare([("a", ids[:200]), ("b", ids[200:300])])
    for step in range(600):
        rid = ids[int(rng.integers(0, len(ids)))]
        if rng.random() < 0.3:
            prepared.discard(rid)
            plain.discard(rid)
        else:
            s = stat(rid, step, "a" if rng.random() < 0.5 else "b")
            report(prepared, [s])
            report(plain, [s])
        if step % 50 == 0:
            for region_id in [*ids, 7, 8]:
                assert prepared.get(region_id) == plain.get(region_id), step
            assert rows_by_topic(prepared) == rows_by_topic(plain), step
    assert len(prepared) == len(plain)


def test_first_reports_join_their_topics_when_the_topic_is_next_read() -> None:
    # Bulk first reports leave their members to the topic's next reader: moves and
    # discards made before that read still win.
    registry = RegionRegistry()
    registry.prepare([("a", [1, 2, 3]), ("b", [4, 5])])
    beat(registry, 7, columns([1, 2, 4], ["a", "a", "b"]), Routes({}), 1.0)
    registry.discard(2)  # joined "a", not yet read
    report(registry, [stat(6, 9, "c")])  # a new row, in the slot 2 freed
    report(registry, [stat(1, 9, "b")])  # moves from "a" to "b"
    beat(registry, 7, columns([3], "a"), Routes({}), 2.0)
    assert sorted(registry.topics()) == ["a", "b", "c"] and len(registry) == 4
    assert sorted(registry.topic_snapshot("a")) == [3]
    assert sorted(registry.topic_snapshot("b")) == [1, 4]
    assert sorted(registry.topic_snapshot("c")) == [6]
    registry.discard(6)
    assert registry.topic_snapshot("b")[1] == row(9, "b")
    registry.discard(3)
    assert registry.topics() == ["b"] and registry.topic_snapshot("b").keys() == {1, 4}


def test_a_second_prepare_adds_slots_only_for_regions_without_one() -> None:
    # A warm follower's table at take-over: prepared before, changed since.
    registry = RegionRegistry()
    assert registry.prepare([("a", [5, 1, 3]), ("b", [9])]) == 4
    report(registry, [stat(20, 1)])  # a region with a row outside the prepared slots
    registry.discard(3)  # deregistered: its slot is gone
    assert registry.prepare([("a", [1, 3, 5, 20, 7]), ("b", [9])]) == 2  # 3 again, 7 new
    assert prepared_for(registry, "a", [1, 3, 5, 7, 9, 20]) == [1, 3, 5, 7]
    assert prepared_for(registry, "b", [9]) == [9]
    assert len(registry) == 1 and registry.get(20) == stat(20, 1)


def test_a_datanodes_first_heartbeat_is_matched_to_its_mapped_regions_in_any_order() -> None:
    # Prepared from routes, the table expects each datanode's mapped regions: a first
    # heartbeat naming exactly them, in any order, is recalled without a lookup, and
    # then as sent; any other list (a region more or less, a duplicate) is not.
    class Route(NamedTuple):
        node_id: int

    mapped = {"a": {11: Route(1), 12: Route(2), 13: Route(1)}, "b": {21: Route(1), 22: Route(2)}}
    registry = RegionRegistry()
    assert registry.prepare(mapped.items()) == 5
    first = columns([21, 13, 11], ["b", "a", "a"])
    assert registry.judge(1, first).recalled
    assert registry.judge(1, first).recalled  # remembered as sent
    twice = registry.judge(2, columns([12, 22, 22], ["a", "b", "b"]))
    assert not twice.recalled and not twice.distinct
    assert not registry.judge(2, columns([12, 22], ["a", "b"])).recalled  # one chance only

    more = RegionRegistry()
    more.prepare(mapped.items())
    more.prepare([("a", {30: Route(2)})])  # mapped since: datanode 2's list is not whole
    assert not more.judge(2, columns([22, 12, 30], ["b", "a", "a"])).recalled
    assert prepared_for(more, "a", [30]) == [30]
    same_length = RegionRegistry()
    same_length.prepare(mapped.items())
    assert not same_length.judge(2, columns([22, 22], "b")).recalled  # a duplicate
    assert not same_length.judge(1, columns([21, 13, 99], ["b", "a", "a"])).recalled
    freed = RegionRegistry()
    freed.prepare(mapped.items())
    freed.discard(12)  # a slot freed since may be another region's
    assert not freed.judge(1, first).recalled
    plain = RegionRegistry()
    plain.prepare([("a", [11, 13]), ("b", [21])])  # ids without routes
    assert not plain.judge(1, columns([11, 13, 21], ["a", "a", "b"])).recalled


def test_a_heartbeat_naming_a_region_twice_is_refused_and_stores_nothing() -> None:
    registry = RegionRegistry()
    report(registry, [stat(1, 5)])
    with pytest.raises(InvalidArgument, match="region 1 is reported more than once"):
        beat(registry, 1, columns([1, 1], flushed=[6, 7]), Routes({}), 2.0)
    assert registry.get(1) == stat(1, 5)
