"""RegionRegistry: latest stat per region, topic stats from cumulative counters, clear()."""

from __future__ import annotations

import math

import pytest

from metasrv.leader import RegionRegistry, row_of
from metasrv.model import RegionStat
from tests._stats import report


def stat(region_id: int, flushed: int, *, at: float = 1.0, topic: str = "t_0") -> RegionStat:
    return RegionStat(
        region_id=region_id,
        node_id=7,
        topic=topic,
        flushed_entry_id=flushed,
        topic_latest_entry_id=None,
        memtable_bytes=10,
        manifest_version=1,
        received_at=at,
    )


def put(reg: RegionRegistry, *stats: RegionStat) -> None:
    """What a heartbeat stores: each stat's row under the topic it names."""
    report(reg, stats)


def test_a_region_keeps_its_latest_stat() -> None:
    reg = RegionRegistry()
    put(reg, stat(1, 5), stat(2, 6))
    put(reg, stat(1, 9))
    assert reg.get(1) == stat(1, 9)
    assert reg.get(2) == stat(2, 6)
    assert reg.get(3) is None
    assert len(reg) == 2 and 1 in reg and 3 not in reg


def test_a_topic_snapshot_is_a_read_only_copy() -> None:
    reg = RegionRegistry()
    put(reg, stat(1, 5))
    snap = reg.topic_snapshot("t_0")
    put(reg, stat(1, 8), stat(2, 1))
    assert snap == {1: row_of(stat(1, 5))}
    assert reg.topic_snapshot("t_0") == {1: row_of(stat(1, 8)), 2: row_of(stat(2, 1))}
    assert snap.get(2) is None and 2 not in snap and 1 in snap
    assert sorted(snap) == [1] and len(snap) == 1
    with pytest.raises(KeyError):
        snap[3]
    with pytest.raises(TypeError):
        snap[3] = row_of(stat(3, 0))  # type: ignore[index]


def test_discard_forgets_one_region() -> None:
    reg = RegionRegistry()
    put(reg, stat(1, 5), stat(2, 6))
    reg.discard(1)
    reg.discard(99)
    assert reg.get(1) is None
    assert reg.get(2) is not None


def test_clear_forgets_everything() -> None:
    reg = RegionRegistry()
    put(reg, stat(1, 5))
    reg.report_topic(7, "t_0", 100, 1000, 10, now=1.0)
    reg.clear()
    assert len(reg) == 0 and reg.get(1) is None
    assert reg.topic_snapshot("t_0") == {}
    assert reg.topic_stats() == {}
    assert reg.topic_stat("t_0") is None


def test_topic_latest_entry_id_is_highest_reported() -> None:
    reg = RegionRegistry()
    reg.report_topic(1, "t", 100, 0, 0, now=1.0)
    reg.report_topic(2, "t", 80, 0, 0, now=2.0)
    stat_ = reg.topic_stat("t")
    assert stat_ is not None
    assert stat_.latest_entry_id == 100
    assert stat_.received_at == 2.0


def test_avg_record_size_uses_counter_growth_in_window() -> None:
    reg = RegionRegistry(window=100.0)
    # Lifetime average 10 B/record, but recent records are 50 B.
    reg.report_topic(1, "t", 0, 10_000, 1_000, now=0.0)
    reg.report_topic(1, "t", 0, 15_000, 1_100, now=10.0)
    s = reg.topic_stat("t")
    assert s is not None and s.avg_record_size == pytest.approx(50.0)


def test_avg_record_size_sums_growth_over_datanodes() -> None:
    reg = RegionRegistry(window=100.0)
    reg.report_topic(1, "t", 0, 0, 0, now=0.0)
    reg.report_topic(2, "t", 0, 0, 0, now=0.0)
    reg.report_topic(1, "t", 0, 1_000, 10, now=5.0)  # 100 B/record
    reg.report_topic(2, "t", 0, 3_000, 10, now=5.0)  # 300 B/record
    s = reg.topic_stat("t")
    assert s is not None and s.avg_record_size == pytest.approx(200.0)


def test_old_growth_decays_with_the_window() -> None:
    reg = RegionRegistry(window=10.0)
    reg.report_topic(1, "t", 0, 0, 0, now=0.0)
    reg.report_topic(1, "t", 0, 1_000, 100, now=5.0)  # 10 B/record
    reg.report_topic(1, "t", 0, 1_000, 100, now=20.0)  # no growth: nothing changes
    s = reg.topic_stat("t")
    assert s is not None and s.avg_record_size == pytest.approx(10.0)
    reg.report_topic(1, "t", 0, 9_000, 200, now=25.0)  # 80 B/record now
    weight = math.exp(-20.0 / 10.0)  # the t=5 growth, 20 s (two windows) old
    expected = (1_000 * weight + 8_000) / (100 * weight + 100)
    s = reg.topic_stat("t")
    assert s is not None and s.avg_record_size == pytest.approx(expected)
    assert 70.0 < expected < 80.0


def test_counter_reset_counts_no_growth() -> None:
    reg = RegionRegistry(window=100.0)
    reg.report_topic(1, "t", 0, 10_000, 100, now=0.0)
    reg.report_topic(1, "t", 0, 20_000, 200, now=1.0)  # 100 B/record
    reg.report_topic(1, "t", 0, 500, 10, now=2.0)  # datanode restarted: counters dropped
    s = reg.topic_stat("t")
    assert s is not None and s.avg_record_size == pytest.approx(100.0)
    reg.report_topic(1, "t", 0, 2_500, 20, now=3.0)  # 200 B/record since the restart
    weight = math.exp(-2.0 / 100.0)
    s = reg.topic_stat("t")
    assert s is not None
    assert s.avg_record_size == pytest.approx((10_000 * weight + 2_000) / (100 * weight + 10))


def test_topic_state_per_datanode_is_constant_over_a_long_run() -> None:
    """The memory bound: a day of reports from 50 datanodes every 3 s keeps one counter
    pair per (topic, datanode), and the average tracks the recent record size."""
    reg = RegionRegistry(window=300.0)
    counters = dict.fromkeys(range(50), (0, 0))
    for step in range(28_800):  # 24 h at one report every 3 s
        now = step * 3.0
        record_bytes = 100 if now < 43_200 else 400  # records grow fourfold half way through
        for node, (size, num) in counters.items():
            counters[node] = size, num = size + 10 * record_bytes, num + 10
            reg.report_topic(node, "t", num, size, num, now)
    acc = reg._topic_acc["t"]
    assert len(acc.nodes) == 50
    assert all(type(v) is tuple and len(v) == 2 for v in acc.nodes.values())
    s = reg.topic_stat("t")
    assert s is not None and s.avg_record_size == pytest.approx(400.0, rel=1e-6)


def test_avg_falls_back_to_lifetime_average_without_growth() -> None:
    reg = RegionRegistry()
    reg.report_topic(1, "t", 0, 4_000, 100, now=0.0)
    s = reg.topic_stat("t")
    assert s is not None and s.avg_record_size == pytest.approx(40.0)
    reg.report_topic(1, "u", 0, 0, 0, now=0.0)
    u = reg.topic_stat("u")
    assert u is not None and u.avg_record_size == 0.0


def test_rows_are_grouped_by_the_topic_they_name() -> None:
    reg = RegionRegistry()
    put(reg, stat(1, 5, topic="a"), stat(2, 6, topic="a"), stat(3, 7, topic="b"))
    assert set(reg.topic_snapshot("a")) == {1, 2}
    assert set(reg.topic_snapshot("b")) == {3}
    assert reg.topic_snapshot("c") == {}
    # A region re-reported on another topic leaves its old topic's group.
    put(reg, stat(2, 8, topic="b"))
    assert set(reg.topic_snapshot("a")) == {1}
    assert set(reg.topic_snapshot("b")) == {2, 3}
    reg.discard(1)
    assert reg.topic_snapshot("a") == {}


def test_topic_snapshot_copies_one_topic() -> None:
    reg = RegionRegistry()
    put(reg, stat(1, 5, topic="a"), stat(3, 7, topic="b"))
    one = reg.topic_snapshot("a")
    put(reg, stat(1, 9, topic="a"))
    assert list(one) == [1]
    assert one[1] == row_of(stat(1, 5, topic="a"))
    assert reg.topic_snapshot("zzz") == {}


def test_a_topic_snapshot_reads_rows_whose_slots_are_out_of_region_order() -> None:
    """The copy finds a row by the slot it had in the table: slots freed and reused, and
    ids that do not follow slot order, read the same through every accessor."""
    reg = RegionRegistry()
    put(reg, stat(6, 60, at=6.0, topic="b"))  # slot 0 is another topic's
    put(reg, *(stat(r, r * 10, at=float(r)) for r in (9, 3, 7, 1, 5)))
    reg.discard(3)
    reg.discard(7)
    put(reg, stat(8, 80, at=8.0), stat(2, 20, at=2.0))
    snap = reg.topic_snapshot("t_0")
    put(reg, stat(9, 99, at=10.0), stat(4, 40))  # later writes do not show
    expected = {r: row_of(stat(r, r * 10, at=float(r))) for r in (9, 1, 5, 8, 2)}
    assert snap == expected
    assert [snap[r] for r in (2, 9, 1)] == [expected[2], expected[9], expected[1]]
    assert snap.rows_of([5, 4, 8]) == [expected[5], None, expected[8]]
    found, received, prunable = snap.columns_of([6, 1, 9, 4])
    assert found.tolist() == [False, True, True, False]
    assert received[found].tolist() == [1.0, 9.0]
    prunable_of = {r: row.prunable_entry_id for r, row in expected.items()}
    assert prunable[found].tolist() == [prunable_of[1], prunable_of[9]]
    assert snap.lowest_prunable(fresh_after=0.5) == min(prunable_of.values())
    assert snap.lowest_prunable(fresh_after=1.5) is None  # region 1's stat is older


def test_a_region_has_one_row_whichever_topic_it_names() -> None:
    reg = RegionRegistry()
    put(reg, stat(1, 5, topic="a"), stat(2, 6, topic="b"))
    assert reg.get(1) == stat(1, 5, topic="a")
    assert reg.get(1, "a") == stat(1, 5, topic="a")
    assert reg.get(1, "b") is None  # a stat naming another topic is not that topic's
    put(reg, stat(1, 7, topic="b"))  # moved: its row leaves topic a
    assert reg.topic_snapshot("a") == {} and sorted(reg.topic_snapshot("b")) == [1, 2]
    assert 2 in reg and 3 not in reg
    reg.discard(2, "b")
    assert reg.get(2) is None and len(reg) == 1
