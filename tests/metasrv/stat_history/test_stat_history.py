"""The stat history writer: what it writes, when, and what it deletes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from metasrv.leader import RegionRegistry, RowColumns
from metasrv.model import RegionStat
from metasrv.stat_history import SNAPSHOTS_DIR, STATS_DIR, StatHistoryWriter, hour_partition
from tests._stats import report
from tests._wait import eventually
from tests.metasrv.reconcile._seed import NOW, stat


def _rows(root: Path, sub: str) -> list[dict[str, Any]]:
    if not (root / sub).exists():
        return []
    table = ds.dataset(root / sub, format="parquet", partitioning="hive").to_table()
    return sorted(table.to_pylist(), key=lambda r: (str(r["ts"]), str(r.get("region_id"))))


def test_hour_partition_is_utc_yyyymmddhh() -> None:
    assert hour_partition(0) == 1970010100
    assert hour_partition(1_800_000_000) == 2027011508


def test_only_stats_received_since_the_last_snapshot_are_written(tmp_path: Path) -> None:
    w = StatHistoryWriter(tmp_path, 60.0)
    s1, s2 = stat(1, "a", NOW - 5, prunable=7), stat(2, "b", NOW - 3)
    assert w.write_snapshot({1: s1, 2: s2}, now=NOW, mono_now=NOW) == 2
    # Region 1 reported again, region 2 did not.
    s1b = stat(1, "a", NOW + 50, prunable=9)
    assert w.write_snapshot({1: s1b, 2: s2}, now=NOW + 60, mono_now=NOW + 60) == 1
    assert w.write_snapshot({1: s1b, 2: s2}, now=NOW + 120, mono_now=NOW + 120) == 0

    rows = _rows(tmp_path, STATS_DIR)
    assert [(r["region_id"], r["prunable_entry_id"], r["accepted"]) for r in rows] == [
        (1, 7, True),
        (2, 10, True),
        (1, 9, True),
    ]
    # Three snapshots are recorded even though the last one wrote no stat.
    snaps = _rows(tmp_path, SNAPSHOTS_DIR)
    assert [(r["regions"], r["written"]) for r in snaps] == [(2, 2), (2, 1), (2, 0)]


def test_received_at_becomes_wall_clock_seen_at(tmp_path: Path) -> None:
    w = StatHistoryWriter(tmp_path, 60.0)
    # Monotonic clock at 1000 while the wall clock says NOW; the stat came 4 s ago.
    s = RegionStat(1, 2, "t", 5, 8, 0, 3, received_at=996.0)
    w.write_snapshot({1: s}, now=NOW, mono_now=1000.0)
    (row,) = _rows(tmp_path, STATS_DIR)
    assert row["seen_at"].timestamp() == pytest.approx(NOW - 4)
    assert row["ts"].timestamp() == pytest.approx(NOW)
    assert (row["prunable_entry_id"], row["topic_latest_entry_id"], row["manifest_version"]) == (
        8,
        8,
        3,
    )


def test_rejected_reports_are_written_once_and_marked(tmp_path: Path) -> None:
    w = StatHistoryWriter(tmp_path, 60.0)
    w.record_rejected([stat(9, "x", NOW - 1), stat(9, "y", NOW - 0.5)])
    w.write_snapshot({}, now=NOW, mono_now=NOW)
    w.write_snapshot({}, now=NOW + 60, mono_now=NOW + 60)
    rows = _rows(tmp_path, STATS_DIR)
    assert [(r["region_id"], r["topic"], r["accepted"]) for r in rows] == [(9, "y", False)]


def test_partitions_older_than_the_retention_are_deleted(tmp_path: Path) -> None:
    w = StatHistoryWriter(tmp_path, 60.0, retention=7200.0)
    w.write_snapshot({1: stat(1, "a", NOW)}, now=NOW, mono_now=NOW)
    w.write_snapshot({1: stat(1, "a", NOW + 3600)}, now=NOW + 3600, mono_now=NOW + 3600)
    old = hour_partition(NOW)
    assert (tmp_path / STATS_DIR / f"hour={old}").is_dir()
    w.write_snapshot({1: stat(1, "a", NOW + 4 * 3600)}, now=NOW + 4 * 3600, mono_now=NOW + 4 * 3600)
    assert not (tmp_path / STATS_DIR / f"hour={old}").exists()
    assert not (tmp_path / SNAPSHOTS_DIR / f"hour={old}").exists()
    assert len(_rows(tmp_path, STATS_DIR)) == 1


def test_bad_parameters_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        StatHistoryWriter(tmp_path, 0.0)
    with pytest.raises(ValueError):
        StatHistoryWriter(tmp_path, 60.0, retention=10.0)


async def test_the_periodic_writer_records_the_source_until_stopped(tmp_path: Path) -> None:
    calls = 0

    def source() -> RegionRegistry:
        nonlocal calls
        calls += 1
        registry = RegionRegistry()
        report(registry, [stat(calls, "t", float(calls))])
        return registry

    w = StatHistoryWriter(tmp_path, 0.05, source)
    await w.start()
    await w.start()  # idempotent
    loop = w.task
    assert loop is not None
    await eventually(lambda: len(_rows(tmp_path, SNAPSHOTS_DIR)) >= 3, "three snapshots")
    await w.stop()
    await w.stop()
    assert loop.done()  # stopped: nothing writes any more
    written = len(_rows(tmp_path, SNAPSHOTS_DIR))
    assert {r["region_id"] for r in _rows(tmp_path, STATS_DIR)} == set(range(1, written + 1))


async def test_a_periodic_pass_reads_the_live_rows_a_slice_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 topics x 5,000 regions, read 5,000 slots at a time: the pass must give the loop
    # back between slices, and still write every row once, plus the rejected reports,
    # in one file.
    registry = RegionRegistry()
    report(registry, [stat(rid, f"t{rid // 5000}", 1.0) for rid in range(15_000)])
    turns = 0
    turns_at_read: list[int] = []
    row_slices = registry.row_slices

    def counted(size: int) -> Iterator[RowColumns]:
        for columns in row_slices(size):
            turns_at_read.append(turns)
            yield columns

    monkeypatch.setattr(registry, "row_slices", counted)
    w = StatHistoryWriter(tmp_path, 60.0, lambda: registry, slice_slots=5000)
    w.record_rejected([stat(99_999, "elsewhere", 1.0)])
    done = False

    async def other_task() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)  # a turn of the loop, counted

    other = asyncio.create_task(other_task())
    await asyncio.sleep(0)  # one loop step: the other task starts
    turns = 0
    written = await w.record()
    done = True
    await other
    assert written == 15_001
    # Each slice was read after the loop had run other work since the previous one.
    assert len(turns_at_read) == 3
    assert turns_at_read[0] < turns_at_read[1] < turns_at_read[2]
    rows = _rows(tmp_path, STATS_DIR)
    accepted = [r for r in rows if r["accepted"]]
    assert sorted(r["region_id"] for r in accepted) == list(range(15_000))
    assert {(r["region_id"] // 5000, r["topic"]) for r in accepted} == {
        (0, "t0"),
        (1, "t1"),
        (2, "t2"),
    }
    assert [(r["region_id"], r["topic"]) for r in rows if not r["accepted"]] == [
        (99_999, "elsewhere")
    ]
    # A second pass writes only the region that reported since.
    report(registry, [stat(5001, "t1", 2.0)])
    assert await w.record() == 1
    (snap1, snap2) = _rows(tmp_path, SNAPSHOTS_DIR)
    assert (snap1["regions"], snap1["written"], snap2["regions"], snap2["written"]) == (
        15_000,
        15_001,
        15_000,
        1,
    )


async def test_start_without_a_source_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        await StatHistoryWriter(tmp_path, 1.0).start()
