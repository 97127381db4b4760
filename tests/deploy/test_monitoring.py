"""The Grafana dashboard and Prometheus rules only name series metasrv exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from metasrv.metrics import Metrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_SERIES = re.compile(r"\bmetasrv_[a-z_]+\b")


def _exported_series() -> set[str]:
    """Every sample name the exposition can carry (counters' _total, histograms' _bucket...)."""
    metrics = Metrics()
    # Touch each labelled family once so it appears in the exposition.
    metrics.pruned_entry_id.labels(topic="t").set(1)
    metrics.prune_point.labels(topic="t").set(1)
    metrics.purge_lag_entries.labels(topic="t").set(1)
    metrics.retained_entries.labels(topic="t").set(1)
    metrics.retained_bytes.labels(topic="t").set(1)
    metrics.log_start_offset.labels(topic="t").set(1)
    metrics.high_watermark.labels(topic="t").set(1)
    metrics.blocked_regions.labels(topic="t").set(1)
    metrics.purges.labels(topic="t").inc()
    metrics.purge_errors.labels(topic="t", kind="k").inc()
    metrics.entries_deleted.labels(topic="t").inc()
    metrics.region_stats_rejected.labels(reason="r").inc()
    metrics.procedure_duration.labels(kind="k", state="succeeded").observe(1)
    metrics.wal_data_loss.labels(topic="t").inc()
    text = metrics.render().decode()
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k in ("expr", "definition") and isinstance(v, str)]
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_grafana_dashboard_names_only_exported_series() -> None:
    exported = _exported_series()
    dashboards = sorted((DEPLOY / "grafana").glob("*.json"))
    assert dashboards, "no Grafana dashboard under deploy/grafana"
    for path in dashboards:
        board = json.loads(path.read_text())
        exprs = _exprs(board["panels"]) + _exprs(board["templating"])
        used = {name for e in exprs for name in _SERIES.findall(e)}
        assert used, f"{path.name} queries no metasrv series"
        assert used <= exported, f"{path.name} names unknown series: {sorted(used - exported)}"
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_dashboard_covers_the_purge_contract() -> None:
    board = json.loads((DEPLOY / "grafana" / "metasrv-wal-purge.json").read_text())
    used = {name for e in _exprs(board["panels"]) for name in _SERIES.findall(e)}
    for series in (
        "metasrv_wal_pruned_entry_id",
        "metasrv_wal_prune_point",
        "metasrv_wal_purge_lag_entries",
        "metasrv_wal_retained_entries",
        "metasrv_wal_retained_bytes_estimated",
        "metasrv_wal_blocked_regions",
        "metasrv_wal_purges_total",
        "metasrv_wal_purge_errors_total",
        "metasrv_wal_data_loss_events_total",
        "metasrv_procedure_duration_seconds_bucket",
        "metasrv_is_leader",
        "metasrv_heartbeats_received_total",
        "metasrv_region_stats_rejected_total",
        "metasrv_flush_instructions_sent_total",
    ):
        assert series in used, f"dashboard lacks {series}"


def test_prometheus_config_and_alerts() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    targets = jobs["metasrv"]["static_configs"][0]["targets"]
    assert targets == ["metasrv-1:4000", "metasrv-2:4000"]
    assert jobs["metasrv"]["metrics_path"] == "/metrics"
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = {name for e in exprs for name in _SERIES.findall(e)}
    assert "metasrv_wal_data_loss_events_total" in used
    assert used <= _exported_series()
