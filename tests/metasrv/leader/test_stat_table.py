"""StatTable: region rows as columns (slots, topics, copies, the per-datanode recall)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from metasrv.leader import NULL, RowValues, StatRow, StatTable, regresses
from tests._gc import tracked_reachable


def row(flushed: int, topic: str = "a", *, node: int = 1, at: float = 1.0) -> StatRow:
    return StatRow(node, topic, flushed, None, 0, 3, at, flushed)


def test_rows_read_back_as_put_with_nulls_kept() -> None:
    table = StatTable(capacity=2)  # grows past its first capacity
    rows = {
        1: row(5),
        2: StatRow(2, "a", 7, 9, 0, None, 2.5, 9),
        3: row(6, "b"),
    }
    for rid, r in rows.items():
        table.put(rid, r)
    assert len(table) == 3 and 2 in table and 4 not in table
    assert dict(table.topic_rows("a").items()) == {1: rows[1], 2: rows[2]}
    assert table.topic_rows("b")[3] == rows[3]
    assert table.columns().latest.tolist() == [NULL, 9, NULL]  # None stored as NULL
    assert table.topic_rows("a").get(3) is None and 3 not in table.topic_rows("a")


def test_a_row_moves_between_topics_and_a_discarded_slot_is_reused() -> None:
    table = StatTable()
    table.put(1, row(5, "a"))
    table.put(2, row(5, "a"))
    slots = table.lookup([1])
    table.put(1, row(6, "b"))
    assert table.lookup([1]).tolist() == slots.tolist()  # moved in place
    assert sorted(table.topic_rows("a")) == [2] and sorted(table.topic_rows("b")) == [1]
    table.discard(2)
    assert table.topics() == ["b"] and len(table.topic_rows("a")) == 0
    table.put(3, row(1, "c"))
    assert table.end == 2 and table.topic_rows("c")[3] == row(1, "c")  # 2's slot reused
    table.discard(99)  # no row: nothing happens
    assert len(table) == 2


def test_assign_overwrites_whole_columns_in_place() -> None:
    table = StatTable()
    for rid in (1, 2, 3):
        table.put(rid, row(rid))
    slots = table.lookup([3, 1, 42])
    assert slots[2] == -1
    values = RowValues(
        ids=np.array([3, 1]),
        flushed=np.array([30, 10]),
        latest=np.array([NULL, 12]),
        memtable=np.array([0, 4]),
        manifest=np.array([5, NULL]),
        prunable=np.array([30, 10]),
    )
    table.assign(slots[:2], 9, values, 7.0)
    bucket = table.topic_rows("a")
    assert bucket[3] == StatRow(9, "a", 30, None, 0, 5, 7.0, 30)
    assert bucket[1] == StatRow(9, "a", 10, 12, 4, None, 7.0, 10)
    assert bucket[2] == row(2)


def test_lowest_prunable_is_none_when_a_row_is_stale_or_there_are_none() -> None:
    table = StatTable()
    assert table.topic_rows("a").lowest_prunable(0.0) is None
    table.put(1, row(5, at=10.0))
    table.put(2, row(3, at=20.0))
    table.put(3, row(1, "b", at=0.0))  # another topic's stale row does not count
    assert table.topic_rows("a").lowest_prunable(10.0) == 3
    assert table.topic_rows("a").lowest_prunable(15.0) is None


def test_a_snapshot_does_not_follow_later_writes() -> None:
    table = StatTable()
    table.put(1, row(5, "a"))
    table.put(2, row(6, "a"))
    table.put(3, row(7, "b"))
    a, b, none = table.snapshot("a"), table.snapshot("b"), table.snapshot("zzz")
    table.put(1, row(9, "a"))
    table.discard(2)
    table.put(4, row(1, "a"))
    assert a == {1: row(5, "a"), 2: row(6, "a")} and b == {3: row(7, "b")}
    assert a.rows_of([2, 4, 1]) == [row(6, "a"), None, row(5, "a")]
    assert a.lowest_prunable(0.0) == 5 and len(none) == 0
    assert none.columns_of([1])[0].tolist() == [False]


def test_recall_needs_the_same_ids_in_order_and_no_discard_since() -> None:
    table = StatTable()
    for rid in (1, 2, 3):
        table.put(rid, row(rid))
    ids = np.array([3, 1, 2])
    slots = table.lookup(ids.tolist())
    table.remember(7, ids, slots)
    assert np.array_equal(table.recall(7, np.array([3, 1, 2])), slots)  # type: ignore[arg-type]
    assert table.recall(7, np.array([1, 3, 2])) is None  # another order
    assert table.recall(8, ids) is None  # another datanode
    table.put(4, row(4))  # a new row moves no slot
    assert table.recall(7, ids) is not None
    table.discard(4)  # a freed slot may be handed to another region
    assert table.recall(7, ids) is None


def test_remembered_regions_stay_within_twice_the_rows() -> None:
    table = StatTable()
    for rid in range(100):
        table.put(rid, row(rid))
    ids = np.arange(100)
    slots = table.lookup(ids.tolist())
    for node in range(50):  # 50 invented datanodes each naming every region
        table.remember(node, ids, slots)
    kept = [node for node in range(50) if table.recall(node, ids) is not None]
    assert kept == [48, 49]  # 200 ids at most: the newest two lists


def test_nothing_in_the_table_is_tracked_by_the_gc() -> None:
    # A full collection must not walk a million rows: it visits the same few containers
    # whatever the table holds.
    small, large = StatTable(), StatTable()
    for table, n in ((small, 10), (large, 1000)):
        for rid in range(n):
            table.put(rid, row(rid, f"t{rid % 7}"))
    large.remember(1, np.arange(1000), large.lookup(list(range(1000))))
    small.remember(1, np.arange(10), small.lookup(list(range(10))))
    assert tracked_reachable(large) == tracked_reachable(small) < 20


def test_put_many_is_put_row_by_row_reusing_free_slots_and_moving_rows() -> None:
    one_by_one, at_once = StatTable(capacity=4), StatTable(capacity=4)
    for table in (one_by_one, at_once):
        for rid in range(6):
            table.put(rid, row(rid, f"t{rid % 2}"))
        table.discard(1)
        table.discard(4)
    batch = {
        0: row(10, "t1"),  # moves from t0
        7: StatRow(3, "t2", 5, 6, 0, None, 2.0, 6),
        8: row(8, "t0"),
        9: row(9, "t0"),
        10: row(11, "t3"),  # more new rows than free slots: the table grows
    }
    for rid, r in batch.items():
        one_by_one.put(rid, r)
    at_once.put_many(list(batch), list(batch.values()))
    for table in (one_by_one, at_once):
        assert sorted(table.topics()) == ["t0", "t1", "t2", "t3"]
        assert table.topic_rows("t1")[0] == row(10, "t1") and 0 not in table.topic_rows("t0")
    assert {t: dict(at_once.topic_rows(t).items()) for t in at_once.topics()} == {
        t: dict(one_by_one.topic_rows(t).items()) for t in one_by_one.topics()
    }
    assert len(at_once) == 8 and at_once.end == one_by_one.end  # both reused slots 1 and 4


def test_rows_of_reads_a_topics_rows_in_order_with_none_for_the_others() -> None:
    table = StatTable()
    table.put(1, row(5, "a"))
    table.put(2, row(6, "b"))
    table.put(3, row(7, "a"))
    rows = table.topic_rows("a")
    assert rows.rows_of([3, 2, 1, 9]) == [row(7, "a"), None, row(5, "a"), None]
    assert rows.rows_of([1, 3]) == [row(5, "a"), row(7, "a")]
    assert rows.rows_of([]) == []


def test_reserve_makes_room_once_and_keeps_the_rows() -> None:
    table = StatTable(capacity=2)
    table.put(1, row(5))
    table.reserve(1000)
    assert table.capacity == 1000 and table.topic_rows("a")[1] == row(5)
    for rid in range(2, 1001):
        table.put(rid, row(rid))
    assert table.capacity == 1000  # no growth while the reserved rows arrive
    table.reserve(10)  # never shrinks
    assert table.capacity == 1000 and table.topic_rows("a")[1000] == row(1000)


def test_judge_is_regresses_a_column_at_a_time() -> None:
    table = StatTable()
    stored = {
        1: StatRow(1, "a", 10, None, 0, 5, 1.0, 10),
        2: StatRow(1, "a", 10, None, 0, None, 1.0, 10),
        3: StatRow(1, "b", 10, None, 0, 5, 1.0, 10),
    }
    for rid, r in stored.items():
        table.put(rid, r)
    # Per region: (region, reported topic, flushed, manifest).
    reports = [
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
    names = ["a", "b", "zzz"]
    ids = [r[0] for r in reports]
    steady, regressed = table.judge(
        table.lookup(ids),
        names,
        np.array([names.index(r[1]) for r in reports]),
        np.array([r[2] for r in reports]),
        np.array([NULL if r[3] is None else r[3] for r in reports]),
    )
    for i, (rid, topic, flushed, manifest) in enumerate(reports):
        old = table.get(rid)
        named = old is not None and old.topic == topic
        expected = named and regresses(old, flushed, manifest)  # type: ignore[arg-type]
        assert bool(regressed[i]) == expected, reports[i]
        assert bool(steady[i]) == (named and not expected), reports[i]
    assert steady.tolist() == [True, False, False, True, False, False, False, False, False]
    # Without a manifest column, every reported manifest is null.
    _, no_manifest = table.judge(table.lookup([1]), names, np.array([0]), np.array([9]), None)
    assert no_manifest.tolist() == [True]


def test_checkpoint_changed_compares_the_prunable_id_and_the_node() -> None:
    table = StatTable()
    table.put(1, row(5, node=1))
    table.put(2, row(6, node=1))
    slots = table.lookup([1, 2])
    assert table.checkpoint_changed(slots, 1, np.array([5, 6])).tolist() == [False, False]
    assert table.checkpoint_changed(slots, 1, np.array([5, 7])).tolist() == [False, True]
    assert table.checkpoint_changed(slots, 2, np.array([5, 6])).tolist() == [True, True]
    assert table.checkpoints([2, 1, 9]) == {2: (1, 6), 1: (1, 5)}


def test_store_names_topics_through_the_reports_names_and_moves_rows() -> None:
    table = StatTable()
    values = RowValues(
        ids=np.array([5, 6, 7]),
        flushed=np.array([1, 2, 3]),
        latest=np.array([NULL, 4, NULL]),
        memtable=np.array([0, 0, 8]),
        manifest=np.array([NULL, NULL, 2]),
        prunable=np.array([1, 4, 3]),
    )
    table.store(values, ["unused", "x", "y"], np.array([2, 1, 2]), 3, 9.0)
    assert sorted(table.topics()) == ["x", "y"]
    assert table.get(6) == StatRow(3, "x", 2, 4, 0, None, 9.0, 4)
    assert dict(table.topic_rows("y").items()) == {
        5: StatRow(3, "y", 1, None, 0, None, 9.0, 1),
        7: StatRow(3, "y", 3, None, 8, 2, 9.0, 3),
    }
    steady, _ = table.judge(table.lookup([5, 6]), ["y"], np.array([0, 0]), np.array([1, 2]), None)
    assert steady.tolist() == [True, False]  # 6 names x
    slot = table.lookup([6]).tolist()
    table.store(values, ["y"], np.zeros(3, np.int64), 4, 10.0)  # 6 moves to y, in place
    assert table.lookup([6]).tolist() == slot and table.topics() == ["y"]
    assert table.snapshot("y")[6] == StatRow(4, "y", 2, 4, 0, None, 10.0, 4)


def values(ids: list[int], flushed: int = 5) -> RowValues:
    n = len(ids)
    return RowValues(
        ids=np.array(ids),
        flushed=np.full(n, flushed),
        latest=np.full(n, NULL),
        memtable=np.zeros(n, np.int64),
        manifest=np.full(n, 3),
        prunable=np.full(n, flushed),
    )


def test_a_prepared_slot_is_not_a_row_until_its_region_reports() -> None:
    table = StatTable()
    assert table.prepare([("a", [30, 10]), ("b", [20])]) == 3
    assert len(table) == 0 and 10 not in table and table.get(10) is None
    assert table.topics() == [] and len(table.topic_rows("a")) == 0
    assert len(table.columns()) == 0 and table.checkpoints([10, 20]) == {}
    slots = table.lookup([10, 20, 30, 99])
    assert (slots[:3] >= 0).all() and slots[3] == -1
    # No row names any topic, not even one no row has named yet (code -1).
    steady, regressed = table.judge(slots, ["zz", "a"], np.array([0, 1, 1, 1]), np.zeros(4), None)
    assert not steady.any() and not regressed.any()
    assert table.prepared_for(slots, ["a", "b"], np.array([0, 1, 0, 0])).tolist() == [
        True,
        True,
        True,
        False,
    ]
    assert table.prepared_for(slots, ["b"], np.zeros(4, np.int64)).tolist() == [
        False,
        True,
        False,
        False,
    ]

    table.store(values([10, 20]), ["a", "b"], np.array([0, 1]), 7, 1.0, slots[:2])
    assert len(table) == 2 and table.lookup([10, 20]).tolist() == slots[:2].tolist()
    assert table.get(10) == StatRow(7, "a", 5, None, 0, 3, 1.0, 5)
    assert sorted(table.topic_rows("b")) == [20] and table.checkpoints([10, 30]) == {10: (7, 5)}
    table.discard(30)  # prepared, never reported
    assert len(table) == 2 and table.lookup([30]).tolist() == [-1]
    table.put(30, row(1, "a"))  # back through the per-region path
    assert len(table) == 3 and sorted(table.topic_rows("a")) == [10, 30]


def test_lookup_by_bisection_agrees_with_the_index_through_discards_and_reuse() -> None:
    rng = np.random.default_rng(3)
    ids = rng.choice(10**9, 400, replace=False).tolist()
    prepared, plain = StatTable(), StatTable()
    prepared.prepare([("a", ids[:200]), ("b", ids[200:300])])
    for step in range(600):
        rid = ids[int(rng.integers(0, len(ids)))]
        if rng.random() < 0.3:
            prepared.discard(rid)
            plain.discard(rid)
        else:
            r = row(step, "a" if rng.random() < 0.5 else "b")
            prepared.put(rid, r)
            plain.put(rid, r)
        if step % 50 == 0:
            probe = [*ids, 7, 8]
            slots = prepared.lookup(probe).tolist()
            for region_id, slot in zip(probe, slots, strict=True):
                expected = plain.get(region_id)
                assert prepared.get(region_id) == expected, step
                if expected is not None:  # its slot holds its row
                    assert slot >= 0 and prepared.rows(np.array([slot]))[0] == expected, step
            assert slots[-2:] == [-1, -1]
    assert len(prepared) == len(plain)


def test_first_reports_join_their_topics_when_the_topic_is_next_read() -> None:
    # Bulk first reports leave their members to the topic's next reader: moves and
    # discards made before that read still win.
    table = StatTable()
    table.prepare([("a", [1, 2, 3]), ("b", [4, 5])])
    first = table.lookup([1, 2, 4])
    table.store(values([1, 2, 4]), ["a", "b"], np.array([0, 0, 1]), 7, 1.0, first)
    table.discard(2)  # joined "a", not yet read
    table.put(6, row(9, "c"))  # a new row, in the slot 2 freed
    table.put(1, row(9, "b"))  # moves from "a" to "b"
    table.store(values([3]), ["a"], np.array([0]), 7, 2.0, table.lookup([3]))
    assert sorted(table.topics()) == ["a", "b", "c"] and len(table) == 4
    assert sorted(table.topic_rows("a")) == [3]
    assert sorted(table.topic_rows("b")) == [1, 4]
    assert sorted(table.topic_rows("c")) == [6]
    table.discard(6)
    assert table.topic_rows("b")[1] == row(9, "b")
    table.discard(3)
    assert table.topics() == ["b"] and table.snapshot("b").keys() == {1, 4}


def test_a_second_prepare_adds_slots_only_for_regions_without_one() -> None:
    # A warm follower's table at take-over: prepared before, changed since.
    table = StatTable()
    assert table.prepare([("a", [5, 1, 3]), ("b", [9])]) == 4
    table.put(20, row(1, "a"))  # a region with a row outside the prepared slots
    table.discard(3)  # deregistered: its slot is gone
    before = table.lookup([1, 5, 9, 20]).tolist()
    assert table.prepare([("a", [1, 3, 5, 20, 7]), ("b", [9])]) == 2  # 3 again, 7 new
    assert table.lookup([1, 5, 9, 20]).tolist() == before
    slots = table.lookup([3, 7])
    assert (slots >= 0).all() and table.prepared_for(slots, ["a"], np.zeros(2, np.int64)).all()
    assert len(table) == 1 and table.get(20) == row(1, "a")


def test_a_datanodes_first_heartbeat_is_matched_to_its_mapped_regions_in_any_order() -> None:
    # Prepared from routes, the table expects each datanode's mapped regions: a first
    # heartbeat naming exactly them, in any order, is recalled without a lookup, and
    # then as sent; any other list (a region more or less, a duplicate) is not.
    class Route(NamedTuple):
        node_id: int

    table = StatTable()
    mapped = {"a": {11: Route(1), 12: Route(2), 13: Route(1)}, "b": {21: Route(1), 22: Route(2)}}
    assert table.prepare(mapped.items()) == 5
    first = np.array([21, 13, 11], np.int64)
    slots = table.recall(1, first)
    assert slots is not None and slots.tolist() == table.lookup([21, 13, 11]).tolist()
    again = table.recall(1, first.copy())
    assert again is not None and again.tolist() == slots.tolist()  # remembered as sent
    assert table.recall(2, np.array([12, 22, 22], np.int64)) is None  # a duplicate
    assert table.recall(2, np.array([12, 22], np.int64)) is None  # one chance only

    more = StatTable()
    more.prepare(mapped.items())
    more.prepare([("a", {30: Route(2)})])  # mapped since: datanode 2's list is not whole
    assert more.recall(2, np.array([22, 12, 30], np.int64)) is None
    assert more.lookup([30]).tolist() != [-1]
    same_length = StatTable()
    same_length.prepare(mapped.items())
    assert same_length.recall(2, np.array([22, 22], np.int64)) is None  # a duplicate
    assert same_length.recall(1, np.array([21, 13, 99], np.int64)) is None  # another region
    freed = StatTable()
    freed.prepare(mapped.items())
    freed.discard(12)  # a slot freed since may be another region's
    assert freed.recall(1, np.array([21, 13, 11], np.int64)) is None
    plain = StatTable()
    plain.prepare([("a", [11, 13]), ("b", [21])])  # ids without routes
    assert plain.recall(1, np.array([11, 13, 21], np.int64)) is None
