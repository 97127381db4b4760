"""The Spark job on local[2] over small seeded worlds: exactly the expected findings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
import pytest

from metasrv.model import PartitionOffsets
from metasrv.reconcile import (
    HIDES_ENTRIES,
    ActionKind,
    Finding,
    FindingKind,
    JobInputs,
    ReconcileParams,
    Severity,
    plan_actions,
    run_job,
)
from tests.metasrv.reconcile._seed import NOW, stat, write_history, write_map

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

POOL = ("wal_0", "wal_1", "wal_2", "wal_3")
PARAMS = ReconcileParams(now=NOW, stale_after=600.0, history_window=3600.0)


def _inputs(tmp: Path, **over: Any) -> JobInputs:
    base: dict[str, Any] = {
        "map_path": str(tmp / "map.parquet"),
        "history_dir": str(tmp / "history"),
        "markers": {"wal_0": 5, "wal_1": None, "wal_2": 50},
        "kafka_topics": frozenset({"wal_0", "wal_1", "wal_2", "wal_9", "other"}),
        "offsets": {
            "wal_0": PartitionOffsets(0, 1000),
            "wal_1": PartitionOffsets(0, 1000),
            "wal_2": PartitionOffsets(100, 1000),
            "wal_9": PartitionOffsets(0, 0),
        },
        "pool": POOL,
        "prefix": "wal",
    }
    base.update(over)
    return JobInputs(**base)


def _run(
    spark: SparkSession, tmp: Path, inputs: JobInputs, params: ReconcileParams
) -> list[Finding]:
    result = run_job(spark, inputs, params, str(tmp / "findings"))
    found = [Finding.from_row(r) for r in pq.read_table(result.findings_path).to_pylist()]
    counted = sum(n for by in result.counts.values() for n in by.values())
    assert counted == len(found)
    return found


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    """The world of `test_seeded_world_yields_exactly_the_expected_findings`."""
    write_map(
        tmp_path / "map.parquet",
        [
            (1, "wal_0", 1, None),  # healthy
            (2, "wal_0", 1, None),  # stale: last stat 1200 s ago
            (3, "wal_1", 2, None),  # stale: never reported
            (4, "wal_1", 2, 5),  # reports wal_2: mismatch
            (5, "wal_2", 3, None),  # prunable 40 < log start 100 - 1: data loss
            (6, "wal_2", 3, 150),  # healthy, prunable 200
            (7, "wal_5", 3, None),  # healthy stat, but its topic is not in Kafka
        ],
    )
    write_history(
        tmp_path / "history",
        [
            (NOW - 3000, {1: stat(1, "wal_0", NOW - 3010), 2: stat(2, "wal_0", NOW - 3005)}, []),
            (NOW - 2000, {}, [stat(9, "wal_1", NOW - 2001)]),  # unmapped long ago: ignored
            (NOW - 1200, {1: stat(1, "wal_0", NOW - 1201), 2: stat(2, "wal_0", NOW - 1200)}, []),
            (
                NOW - 60,
                {
                    1: stat(1, "wal_0", NOW - 70),
                    2: stat(2, "wal_0", NOW - 1200),  # unchanged: not written again
                    5: stat(5, "wal_2", NOW - 65, prunable=40),
                    6: stat(6, "wal_2", NOW - 64, prunable=200),
                    7: stat(7, "wal_5", NOW - 63, prunable=30),
                },
                [
                    stat(4, "wal_2", NOW - 66, node_id=7),
                    stat(8, "wal_1", NOW - 62, node_id=4),
                ],
            ),
        ],
    )
    return tmp_path


def test_seeded_world_yields_exactly_the_expected_findings(
    spark: SparkSession, seeded: Path
) -> None:
    found = _run(spark, seeded, _inputs(seeded), PARAMS)
    by_key = {f.key: f for f in found}
    assert len(by_key) == len(found), "duplicate findings"
    assert {(k, f.severity) for k, f in by_key.items()} == {
        (("stale_region", "wal_0", 2), Severity.WARNING),
        (("stale_region", "wal_1", 3), Severity.WARNING),
        (("topic_mismatch", "wal_1", 4), Severity.CRITICAL),
        (("retention_overrun", "wal_2", 5), Severity.CRITICAL),
        (("unmapped_region", "wal_1", 8), Severity.WARNING),
        (("missing_topic", "wal_3", None), Severity.WARNING),
        (("missing_topic", "wal_5", None), Severity.CRITICAL),
        (("orphan_topic", "wal_9", None), Severity.INFO),
        (("skew", None, None), Severity.WARNING),
    }
    assert by_key["stale_region", "wal_0", 2].evidence == {
        "node_id": 1,
        "last_seen_ms": int((NOW - 1200) * 1000),
        "age_s": 1200,
        "unseen_for_at_least_s": None,
        "stale_after_s": 600,
        "checkpoint_entry_id": None,
    }
    assert by_key["stale_region", "wal_1", 3].evidence["unseen_for_at_least_s"] == 3000
    mismatch = by_key["topic_mismatch", "wal_1", 4].evidence
    assert (mismatch["reported_topic"], mismatch["reported_node_id"]) == ("wal_2", 7)
    overrun = by_key["retention_overrun", "wal_2", 5].evidence
    assert overrun["log_start_offset"] == 100
    assert overrun["prunable_entry_id"] == 40
    assert overrun["missing_entries"] == 59
    assert overrun["source"] == "stat"
    unmapped = by_key["unmapped_region", "wal_1", 8]
    assert unmapped.evidence["node_id"] == 4
    assert by_key["missing_topic", "wal_5", None].evidence["held_data"] is True
    assert by_key["missing_topic", "wal_3", None].evidence["held_data"] is False
    skew = by_key["skew", None, None].evidence
    assert (skew["min"], skew["max"], skew["proposed_assignment"]) == (0, 2, {"wal_3": 2})
    # Most urgent first, as the SQL export and the API rely on.
    ranks = [{"critical": 0, "warning": 1, "info": 2}[f.severity] for f in found]
    assert ranks == sorted(ranks)

    plan = plan_actions(found, kafka_topics=_inputs(seeded).kafka_topics, drop_stale_after=1000)
    assert {(a.kind.value, a.topic, a.region_id, a.node_id) for a in plan.actions} == {
        ("create_topic", "wal_3", None, None),
        ("register_region", "wal_1", 8, 4),
        ("drop_region", "wal_0", 2, None),
        ("drop_region", "wal_1", 3, None),
    }


def test_a_consistent_world_has_no_findings(spark: SparkSession, tmp_path: Path) -> None:
    write_map(tmp_path / "map.parquet", [(1, "wal_0", 1, 3), (2, "wal_1", 1, None)])
    write_history(
        tmp_path / "history",
        [
            (NOW - 3000, {1: stat(1, "wal_0", NOW - 3001)}, []),
            (NOW - 30, {1: stat(1, "wal_0", NOW - 31), 2: stat(2, "wal_1", NOW - 32)}, []),
        ],
    )
    inputs = _inputs(
        tmp_path,
        kafka_topics=frozenset({"wal_0", "wal_1"}),
        offsets={"wal_0": PartitionOffsets(4, 10), "wal_1": PartitionOffsets(0, 10)},
        pool=("wal_0", "wal_1"),
        markers={"wal_0": 3},
    )
    assert _run(spark, tmp_path, inputs, PARAMS) == []


@pytest.mark.parametrize(
    ("snapshot_age", "note"),
    [
        # The recorder stopped 2000 s ago: nobody can be called stale.
        (2000, "stale_region check skipped"),
        # History began 300 s ago (< stale_after): a never-seen region is not yet stale.
        (300, "never seen"),
    ],
)
def test_staleness_needs_enough_recent_history(
    spark: SparkSession, tmp_path: Path, snapshot_age: float, note: str
) -> None:
    write_map(tmp_path / "map.parquet", [(1, "wal_0", 1, None), (2, "wal_1", 1, None)])
    seen = NOW - snapshot_age
    write_history(tmp_path / "history", [(seen, {1: stat(1, "wal_0", seen - 1)}, [])])
    inputs = _inputs(
        tmp_path,
        kafka_topics=frozenset({"wal_0", "wal_1"}),
        pool=("wal_0", "wal_1"),
        markers={},
    )
    result = run_job(spark, inputs, PARAMS, str(tmp_path / "findings"))
    assert result.counts == {}
    assert any(note in n for n in result.notes)


def test_no_history_at_all(spark: SparkSession, tmp_path: Path) -> None:
    write_map(tmp_path / "map.parquet", [(1, "wal_0", 1, 2)])
    inputs = _inputs(
        tmp_path,
        kafka_topics=frozenset({"wal_0"}),
        offsets={"wal_0": PartitionOffsets(10, 20)},
        pool=("wal_0",),
        markers={},
    )
    found = _run(spark, tmp_path, inputs, PARAMS)
    # Only the checkpoint is known: 10 > 2 + 1 is data loss even with no stat history.
    assert [(f.kind, f.region_id, f.evidence["source"]) for f in found] == [
        (FindingKind.RETENTION_OVERRUN, 1, "checkpoint")
    ]


def test_an_unmapped_region_needing_entries_below_the_marker_is_data_loss_not_a_repair(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Registering a region that already wrote to a purged topic would let the plan's
    `max(prunable, marker)` and replay-start skip its entries silently: the job says WAL
    data loss, and the apply planner leaves it alone."""
    write_map(tmp_path / "map.parquet", [(1, "wal_0", 1, None)])
    write_history(
        tmp_path / "history",
        [
            (
                NOW - 60,
                {1: stat(1, "wal_0", NOW - 70, prunable=900)},
                [
                    stat(10, "wal_0", NOW - 61, node_id=4, prunable=3),  # marker 5
                    stat(11, "wal_2", NOW - 61, node_id=4, prunable=60),  # log start 100
                    stat(12, "wal_0", NOW - 61, node_id=4, prunable=5),  # needs 6..: safe
                    stat(13, "wal_1", NOW - 61, node_id=4, prunable=-1),  # never purged
                ],
            ),
        ],
    )
    found = _run(spark, tmp_path, _inputs(tmp_path), PARAMS)
    unmapped = {f.region_id: f for f in found if f.kind is FindingKind.UNMAPPED_REGION}
    assert {r: (f.severity, f.evidence["wal_data_loss"]) for r, f in unmapped.items()} == {
        10: (Severity.CRITICAL, True),
        11: (Severity.CRITICAL, True),
        12: (Severity.WARNING, False),
        13: (Severity.WARNING, False),
    }
    assert unmapped[10].message.startswith("WAL data loss: ")
    assert "needs entries from 4" in unmapped[10].message
    assert (
        unmapped[10].evidence["pruned_entry_id"],
        unmapped[10].evidence["log_start_offset"],
    ) == (
        5,
        0,
    )
    assert unmapped[11].evidence["log_start_offset"] == 100
    assert unmapped[13].evidence["pruned_entry_id"] is None
    plan = plan_actions(found, kafka_topics=_inputs(tmp_path).kafka_topics, drop_stale_after=None)
    registered = {a.region_id for a in plan.actions if a.kind is ActionKind.REGISTER_REGION}
    assert registered == {12, 13}
    assert plan.skipped[HIDES_ENTRIES] == 2
