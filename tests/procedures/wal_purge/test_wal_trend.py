"""The WAL trend ring (procedures/wal_purge/_trend.py): bounds, order, gaps, purges. Pure."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metasrv.errors import ConfigError
from metasrv.settings import load_settings
from procedures.wal_purge import PurgeMark, Retained, TrendRing, trend_capacity


def mark(pid: str, at: float, topic: str = "t0", freed: int = 10) -> PurgeMark:
    return PurgeMark(
        at=at,
        topic=topic,
        procedure_id=pid,
        prune_point=freed,
        entries_deleted=freed,
        bytes_estimated=freed * 100,
        logical_delete=False,
    )


def test_capacity_covers_the_window_at_both_ends() -> None:
    assert trend_capacity(15.0, 3600.0) == 241
    assert trend_capacity(0.5, 10.0) == 21
    assert trend_capacity(0.0, 3600.0) == 1  # off: one idle slot


@given(capacity=st.integers(1, 12), samples=st.integers(0, 40))
def test_keeps_the_newest_samples_oldest_first(capacity: int, samples: int) -> None:
    ring = TrendRing(capacity)
    for i in range(samples):
        ring.record(1000.0 + i, {"t0": Retained(entries=i, bytes=i * 100)})
    kept = list(range(max(0, samples - capacity), samples))
    view = ring.view()
    assert len(ring) == len(kept)
    assert view.times == tuple(1000.0 + i for i in kept)
    if kept:
        (series,) = view.series
        assert series.entries == tuple(kept)
        assert series.bytes == tuple(i * 100 for i in kept)
        assert view.total_entries == tuple(kept)
    else:
        assert view.series == ()


def test_a_topic_not_sampled_has_a_gap_and_is_forgotten_after_a_whole_ring() -> None:
    ring = TrendRing(3)
    ring.record(1.0, {"a": Retained(5, 50), "b": Retained(7, None)})
    ring.record(2.0, {"a": Retained(6, 60)})  # Kafka gave nothing for b
    view = ring.view()
    by_topic = {s.topic: s for s in view.series}
    assert by_topic["b"].entries == (7, None)
    assert by_topic["b"].bytes == (None, None)
    assert view.total_entries == (12, 6)
    assert view.total_bytes == (50, 60)  # b's size was never known
    ring.record(3.0, {"a": Retained(6, 60)})
    assert sorted(ring.topics()) == ["a", "b"]  # its last value is still in the ring
    ring.record(4.0, {"a": Retained(6, 60)})
    assert ring.topics() == ["a"]
    ring.record(5.0, {})
    assert ring.view().total_entries == (6, 6, None)


def test_times_never_go_back_when_the_clock_does() -> None:
    ring = TrendRing(4)
    for at in (10.0, 12.0, 11.0, 13.0):
        ring.record(at, {"a": Retained(1, 1)})
    assert ring.view().times == (10.0, 12.0, 12.0, 13.0)


def test_view_picks_topics_by_name_or_the_largest_now() -> None:
    ring = TrendRing(4)
    ring.record(1.0, {"a": Retained(900, 9000), "b": Retained(10, 100), "c": Retained(5, None)})
    ring.record(2.0, {"a": Retained(1, 10), "b": Retained(20, 200), "c": Retained(50, None)})
    assert [s.topic for s in ring.view().series] == ["b", "a", "c"]  # bytes, then entries
    assert [s.topic for s in ring.view(top=1).series] == ["b"]
    assert [s.topic for s in ring.view(topics={"c", "zz"}).series] == ["c"]
    view = ring.view(top=1)
    assert view.topics == 3
    assert view.total_entries == (915, 71)


def test_purges_are_kept_once_in_time_order_and_bounded() -> None:
    ring = TrendRing(2, purge_capacity=3)
    assert ring.add_purges([mark("p2", 20.0), mark("p1", 10.0)]) == 2
    assert ring.add_purges([mark("p1", 10.0), mark("p3", 30.0)]) == 1  # p1 again: once
    assert [m.procedure_id for m in ring.view().purges] == ["p1", "p2", "p3"]
    ring.add_purges([mark("p4", 5.0), mark("p5", 40.0)])  # over capacity: the oldest go
    assert [m.procedure_id for m in ring.view().purges] == ["p2", "p3", "p5"]
    ring.drop_purges_before(30.0)
    assert [m.procedure_id for m in ring.view().purges] == ["p3", "p5"]
    ring.clear()
    assert ring.view().purges == () and len(ring) == 0 and ring.topics() == []


def test_purges_show_without_samples() -> None:
    ring = TrendRing(5)
    ring.add_purges([mark("p1", 1.0, topic="gone")])
    view = ring.view(top=3)
    assert view.times == () and view.series == ()
    assert [m.topic for m in view.purges] == ["gone"]


def test_rejects_an_empty_ring() -> None:
    with pytest.raises(ValueError):
        TrendRing(0)


def test_memory_per_topic_is_its_two_rings() -> None:
    """The module docstring's figure: 16 bytes per slot and topic (3,856 at 241 slots),
    about 4.2 KB with the topic's bookkeeping."""
    ring = TrendRing(241)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(241 * 2):  # full, and wrapped once
            ring.record(float(i), {f"topic_{n}": Retained(i, i * 100) for n in range(256)})
        per_topic = (tracemalloc.get_traced_memory()[0] - before) / 256
    finally:
        tracemalloc.stop()
    assert 241 * 16 <= per_topic < 4_300, per_topic


def test_the_dashboard_settings_bound_the_ring() -> None:
    defaults = load_settings().dashboard
    assert (defaults.sample_interval, defaults.window) == (15.0, 3600.0)
    with pytest.raises(ConfigError, match="10000 samples"):
        load_settings(dashboard={"sample_interval": "1s", "window": "1d"})
    assert load_settings(dashboard={"sample_interval": "0s", "window": "7d"}).dashboard.window
    with pytest.raises(ConfigError, match="window"):
        load_settings(dashboard={"window": "0s"})
