"""`sample()` reads metrics as /metrics exports them, and tests read metrics only through it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from metasrv.metrics import Metrics
from tests._metrics import sample
from tests._source import nodes

ROOT = Path(__file__).resolve().parent.parent
_INTERNALS = {"_value", "_sum", "_buckets", "_count", "_created"}


def test_sample_reads_counters_gauges_and_histograms() -> None:
    metrics = Metrics()
    metrics.heartbeats.inc(3)
    metrics.purge_errors.labels(topic="t", kind="kafka").inc()
    metrics.prune_point.labels(topic="t").set(-1)
    metrics.procedure_duration.labels(kind="wal_purge", state="succeeded").observe(0.3)

    assert sample(metrics, "metasrv_heartbeats_received_total") == 3
    assert sample(metrics, "metasrv_wal_purge_errors_total", {"topic": "t", "kind": "kafka"}) == 1
    assert sample(metrics, "metasrv_wal_prune_point", {"topic": "t"}) == -1
    done = {"kind": "wal_purge", "state": "succeeded"}
    assert sample(metrics, "metasrv_procedure_duration_seconds_count", done) == 1
    assert sample(metrics, "metasrv_procedure_duration_seconds_sum", done) == pytest.approx(0.3)
    # A counter series never touched reads 0, as Prometheus treats an absent counter.
    assert sample(metrics, "metasrv_wal_purge_errors_total", {"topic": "u", "kind": "x"}) == 0


def test_sample_refuses_names_nothing_exports_and_gauges_never_set() -> None:
    metrics = Metrics()
    with pytest.raises(LookupError, match="no metric exports"):
        sample(metrics, "metasrv_heartbeats_received")  # the counter's sample ends in _total
    with pytest.raises(LookupError, match="no metric exports"):
        sample(metrics, "metasrv_heartbeats_received_totl")
    with pytest.raises(LookupError, match="no series"):
        sample(metrics, "metasrv_wal_prune_point", {"topic": "never_set"})


def prometheus_internals(root: Path, dirs: list[str]) -> set[str]:
    """`file:line` of every `<metric>._value.get()`-style read of a metric's internals."""
    found: set[str] = set()
    for directory in dirs:
        for path in sorted((root / directory).rglob("*.py")):
            for node in nodes(path):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                    and isinstance(node.func.value, ast.Attribute)
                    and node.func.value.attr in _INTERNALS
                ):
                    found.add(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_tests_read_metrics_through_sample() -> None:
    assert prometheus_internals(ROOT, ["tests", "benchmarks"]) == set()


def test_the_internals_scan_finds_a_private_read(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test(m):\n    assert m.heartbeats._value.get() == 1\n"
        "    assert m.d.labels(kind='k')._sum.get() > 0\n    assert m.cache.get('_value')\n"
    )
    assert prometheus_internals(tmp_path, ["tests"]) == {"tests/test_x.py:2", "tests/test_x.py:3"}
