"""Engine-independent rules: skew, topic checks, coverage (pure)."""

from __future__ import annotations

from metasrv.model import PartitionOffsets
from metasrv.reconcile import (
    Coverage,
    FindingKind,
    ReconcileParams,
    Severity,
    TopicFacts,
    skew_finding,
    topic_findings,
)

PARAMS = ReconcileParams(now=10_000.0, stale_after=600.0, history_window=3600.0)


def test_balanced_pool_is_not_skewed() -> None:
    assert skew_finding({"p_0": 10, "p_1": 11, "p_2": 12}, 0.25, "p") is None
    # Tiny pools: a spread of one region is always fine.
    assert skew_finding({"p_0": 0, "p_1": 1, "p_2": 1}, 0.0, "p") is None
    assert skew_finding({"p_0": 5}, 0.0, "p") is None


def test_skew_proposes_filling_the_least_loaded_first() -> None:
    f = skew_finding({"p_0": 30, "p_1": 10, "p_2": 20, "p_10": 10}, 0.25, "p")
    assert f is not None
    assert (f.kind, f.severity) == (FindingKind.SKEW, Severity.WARNING)
    # Ties go to the lower pool index (p_1 before p_10).
    assert list(f.evidence["proposed_assignment"].items()) == [
        ("p_1", 20),
        ("p_10", 20),
        ("p_2", 10),
    ]
    assert f.evidence["new_regions_to_balance"] == 50
    assert f.evidence["most_loaded"][0] == ["p_0", 30]


def test_topic_findings_missing_orphan_and_held_data() -> None:
    found = topic_findings(
        facts={"p_0": TopicFacts(2, 40), "p_1": TopicFacts(1, -1), "x_1": TopicFacts(1, 5)},
        markers={"p_0": 3, "p_7": None},
        kafka_topics={"p_0", "p_8", "p_9", "unrelated", "x_1"},
        offsets={"p_8": PartitionOffsets(0, 12)},
        pool=["p_0", "p_1", "p_2"],
        prefix="p",
        skew_tolerance=10.0,
    )
    got = {(f.kind.value, f.topic): f for f in found}
    assert set(got) == {
        ("missing_topic", "p_1"),  # pool, 1 region that never advanced
        ("missing_topic", "p_2"),  # pool, empty
        ("missing_topic", "p_7"),  # marker only
        ("orphan_topic", "p_8"),
        ("orphan_topic", "p_9"),
    }
    assert got["missing_topic", "p_1"].severity is Severity.CRITICAL
    assert got["missing_topic", "p_1"].evidence["held_data"] is False
    assert got["missing_topic", "p_2"].severity is Severity.WARNING
    assert got["missing_topic", "p_7"].evidence["held_data"] is False
    assert got["orphan_topic", "p_8"].evidence["high_watermark"] == 12
    assert got["orphan_topic", "p_9"].evidence["high_watermark"] is None


def test_coverage_decides_what_staleness_can_be_judged() -> None:
    cutoff = PARAMS.stale_cutoff_ms
    assert Coverage(None, None, 0).stale_check(PARAMS)[:2] == (False, False)
    assert Coverage(cutoff - 10, cutoff - 1, 2).stale_check(PARAMS)[:2] == (False, False)
    assert Coverage(cutoff + 1, cutoff + 5, 2).stale_check(PARAMS)[:2] == (True, False)
    assert Coverage(cutoff, cutoff + 5, 2).stale_check(PARAMS) == (True, True, None)


def test_window_reaches_back_at_least_stale_after() -> None:
    p = ReconcileParams(now=10_000.0, stale_after=5000.0, history_window=60.0)
    assert p.window_start == 5000.0
