"""The Grafana dashboard and the alert rules against a real Prometheus scraping real metasrv.

One scenario per module (`scenario`): a simulated datanode heartbeats a leader (a follower
stands by) while two purges succeed on one topic (a region is asked to flush first), a topic
loses entries a region needs (DeleteRecords outside metasrv) and its purge fails twice as
WAL data loss, a third topic stays blocked by a region that never reports, an unregistered
region is rejected on every heartbeat, and the replicas' stat history writers fail every
round. Then: every series the dashboard and the rules name is scraped, every panel query
returns data (non-zero where the thing it shows happened), the rules load, and the alerts
for what happened are active while the others are not.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from metasrv.kafka import KafkaAdmin
from tests._wait import wait_until
from tests.deploy._prometheus import RATE_INTERVAL, PrometheusServer
from tests.deploy.conftest import ALERT_RULES, DEPLOY, MonitoredPair
from tests.toolbox.simulator._heartbeats import reported
from tests.toolbox.simulator._metasrv import DATANODE, OPERATOR
from toolbox.simulator import SimDatanode, SimRegion, free_port

DASHBOARD = DEPLOY / "grafana" / "metasrv-wal-purge.json"
# A metasrv series name, not the middle of a recorded `level:metric:operation` name.
_SERIES = re.compile(r"(?<![\w:])metasrv_[a-z_]+\b")
A, B, C, D, E = ((26 << 32) | n for n in range(1, 6))
TERMINAL = {"succeeded", "skipped", "failed", "cancelled"}
# Panels whose value is legitimately 0 all along in the scenario.
ONLY_WITH_THE_ARCHIVE = {
    "metasrv_wal_archive_blocked": "set by a purge's archive check (DESIGN §8); this scenario "
    "runs with the archive off, tests/api/test_purge_not_archived_api.py reads it by this name",
}
"""Series the rules name that exist only with `[wal.archive] enabled`."""

ZERO_IS_TRUE = {"Procedures running": "no purge runs while Prometheus scrapes (one per second)"}


@dataclass(frozen=True)
class Scenario:
    pair: MonitoredPair
    started: float
    """Unix time before the first write."""

    @property
    def purged(self) -> str:
        return self.pair.topics[0]

    @property
    def lost(self) -> str:
        return self.pair.topics[1]

    @property
    def blocked(self) -> str:
        return self.pair.topics[2]


def _write(region: SimRegion, n: int) -> None:
    for future in [region.write("x" * 200) for _ in range(n)]:
        future.result(30)


def _purge(operator: httpx.Client, datanode: SimDatanode, topic: str) -> dict[str, Any]:
    reported(datanode)
    submitted = operator.post("/v1/purge", json={"topics": [topic], "dry_run": False})
    assert submitted.status_code == 202, submitted.text
    (procedure_id,) = submitted.json()["procedure_ids"]

    def finished() -> dict[str, Any] | None:
        info: dict[str, Any] = operator.get(f"/v1/procedures/{procedure_id}").json()
        return info if info["state"] in TERMINAL else None

    return wait_until(finished, f"purge {procedure_id} finished", timeout=60, interval=0.2)


def _value(prometheus: PrometheusServer, expr: str) -> float:
    result = prometheus.query(expr)
    return float(result[0]["value"][1]) if result else math.nan


def _wait_scraped(prometheus: PrometheusServer, expr: str, at_least: float) -> None:
    wait_until(
        lambda: _value(prometheus, expr) >= at_least,
        f"{expr} >= {at_least}",
        timeout=10,
        interval=0.2,
    )


@pytest.fixture(scope="module")
def scenario(
    monitored_pair: MonitoredPair, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scenario]:
    pair = monitored_pair
    prometheus = pair.prometheus
    purged, lost, blocked = pair.topics
    operator = httpx.Client(
        base_url=pair.leader.url, headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=30
    )
    datanode = SimDatanode(
        1,
        pair.leader.url,
        DATANODE,
        kafka_bootstrap,
        tmp_path_factory.mktemp("datanode"),
        heartbeat_interval=0.3,
        flush_threshold_bytes=None,
    )
    admin = KafkaAdmin(kafka_bootstrap)
    try:
        started = time.time()
        for region, topic in ((A, purged), (B, purged), (C, lost), (D, blocked)):
            answer = operator.post(
                "/v1/regions", json={"region_id": region, "node_id": 1, "topic": topic}
            )
            assert answer.status_code == 201, answer.text
        busy = datanode.add_region(A, purged)
        slow = datanode.add_region(B, purged)
        needy = datanode.add_region(C, lost)
        datanode.add_region(E, purged)  # never registered: rejected on every heartbeat
        datanode.start()

        _write(busy, 5)
        busy.flush()
        _write(slow, 60)  # ~16 KiB to replay, above the 4 KiB trigger: asked to flush
        _write(needy, 20)  # never flushed: needs its topic from entry 0
        first = _purge(operator, datanode, purged)
        assert first["state"] == "succeeded", first
        assert datanode.flushes_instructed >= 1
        _wait_scraped(prometheus, f'metasrv_wal_purges_total{{topic="{purged}"}}', 1)
        _write(busy, 5)
        busy.flush()
        _write(slow, 5)
        slow.flush()
        reported(datanode)
        # Both flushed past the marker: the lag the next purge clears, scraped for its panel.
        _wait_scraped(prometheus, f'metasrv_wal_purge_lag_entries{{topic="{purged}"}}', 1)
        second = _purge(operator, datanode, purged)
        assert second["state"] == "succeeded", second

        admin.delete_records({lost: 10})  # retention (or another tool) went too far
        for n in (1, 2):
            failed = _purge(operator, datanode, lost)
            assert failed["state"] == "failed", failed
            assert failed["error_code"] == "wal_data_loss", failed
            # A labelled counter appears at its first event, already at 1: the panels'
            # increase() sees the second event only if a scrape falls between the two.
            _wait_scraped(prometheus, f'metasrv_wal_data_loss_events_total{{topic="{lost}"}}', n)

        checks = {
            f'metasrv_wal_purges_total{{topic="{purged}"}}': 2,
            f'sum(metasrv_wal_purge_errors_total{{topic="{lost}"}})': 2,
            'max(metasrv_background_task_errors_total{task="stat_history"})': 2,
            'sum(metasrv_region_stats_rejected_total{reason="unknown_region"})': 2,
        }

        for expr, at_least in checks.items():
            _wait_scraped(prometheus, expr, at_least)
        yield Scenario(pair, started)
    finally:
        datanode.close()
        admin.close()
        operator.close()


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k in ("expr", "definition") and isinstance(v, str)]
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERT_RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _grafana(expr: str, topics: list[str]) -> str:
    """Substitute the dashboard's variables as Grafana does for job=metasrv and every topic."""
    out = (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$job", "metasrv")
        .replace("$topic", "(" + "|".join(topics) + ")")
    )
    assert "$" not in out, f"unknown Grafana variable left in {out}"
    return out


def test_prometheus_scrapes_the_leader_and_the_follower(scenario: Scenario) -> None:
    prometheus, pair = scenario.pair.prometheus, scenario.pair
    up = {s["metric"]["instance"]: s["value"][1] for s in prometheus.query('up{job="metasrv"}')}
    leads = {s["metric"]["instance"]: s["value"][1] for s in prometheus.query("metasrv_is_leader")}
    leader, follower = MonitoredPair.instance(pair.leader), MonitoredPair.instance(pair.follower)
    assert up == {leader: "1", follower: "1"}
    assert leads == {leader: "1", follower: "0"}


def test_every_series_the_dashboard_and_the_rules_name_is_scraped(scenario: Scenario) -> None:
    board = json.loads(DASHBOARD.read_text())
    named = {
        name
        for expr in _exprs(board["panels"]) + _exprs(board["templating"])
        for name in _SERIES.findall(expr)
    }
    from_rules = {name for rule in _rules() for name in _SERIES.findall(rule["expr"])}
    assert "metasrv_background_task_errors_total" in from_rules
    scraped = set(scenario.pair.prometheus.api("label/__name__/values"))
    missing = sorted((named | from_rules) - scraped - ONLY_WITH_THE_ARCHIVE.keys())
    assert not missing, f"named but never scraped: {missing}"


def test_recorded_series_take_the_leaders_values(scenario: Scenario) -> None:
    prometheus, topics = scenario.pair.prometheus, scenario.pair.topics
    leader = MonitoredPair.instance(scenario.pair.leader)

    def recorded() -> dict[str, str] | None:
        found = {
            s["metric"]["topic"]: s["value"][1]
            for s in prometheus.query("job_topic:metasrv_wal_blocked_regions:leader")
        }
        return found if set(found) == set(topics) else None

    blocked = wait_until(recorded, "the recording rule", timeout=10, interval=0.2)
    assert blocked[scenario.blocked] == "1"
    raw = prometheus.query(f'metasrv_wal_blocked_regions{{topic="{scenario.blocked}"}}')
    assert [s["metric"]["instance"] for s in raw] == [leader]  # the follower never led


def test_every_grafana_panel_query_returns_data(scenario: Scenario) -> None:
    prometheus, topics = scenario.pair.prometheus, scenario.pair.topics
    board = json.loads(DASHBOARD.read_text())
    problems: list[str] = []
    # The panels' time range: the scenario up to now, a point every second ending now.
    now = time.time()
    start = now - math.ceil(now - scenario.started)
    panels = [p for p in board["panels"] if p.get("targets")]
    assert len(panels) >= 15
    for panel in panels:
        nonzero = False
        for target in panel["targets"]:
            expr = _grafana(target["expr"], topics)
            series = prometheus.query_range(expr, start, now, "1s")
            if not series:
                problems.append(f"{panel['title']!r}: no data from {expr}")
                continue
            values = [float(v) for s in series for _, v in s["values"]]
            nonzero |= any(math.isfinite(v) and v != 0 for v in values)
        if not nonzero and panel["title"] not in ZERO_IS_TRUE:
            problems.append(f"{panel['title']!r}: only zeros, though what it shows happened")
    assert not problems, "\n".join(problems)


def test_grafana_variables_list_the_job_and_the_topics(scenario: Scenario) -> None:
    prometheus = scenario.pair.prometheus
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    label_values = re.compile(r"^label_values\((?P<match>.+), (?P<label>\w+)\)$")
    found: dict[str, list[str]] = {}
    for name in ("job", "topic"):
        query = label_values.match(variables[name]["definition"])
        assert query is not None, variables[name]
        match = query["match"].replace("$job", "metasrv")
        found[name] = prometheus.api(f"label/{query['label']}/values", **{"match[]": match})
    assert found["job"] == ["metasrv"]
    assert found["topic"] == sorted(scenario.pair.topics)


def test_alert_rules_load_into_the_server(scenario: Scenario) -> None:
    prometheus = scenario.pair.prometheus
    expected = sorted(rule.get("alert") or rule["record"] for rule in _rules())

    def evaluated() -> list[dict[str, Any]] | None:
        groups = prometheus.api("rules")["groups"]
        rules: list[dict[str, Any]] = [r for g in groups for r in g["rules"]]
        return rules if all(r["health"] != "unknown" for r in rules) else None

    rules = wait_until(evaluated, "every rule evaluated once", timeout=10, interval=0.2)
    assert sorted(r["name"] for r in rules) == expected
    unhealthy = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert unhealthy == {}


def _active(prometheus: PrometheusServer) -> dict[tuple[str, ...], dict[str, Any]]:
    """Active alerts by (alertname, topic or task[, instance])."""
    keyed: dict[tuple[str, ...], dict[str, Any]] = {}
    for alert in prometheus.api("alerts")["alerts"]:
        labels = alert["labels"]
        about = (labels.get("topic") or labels.get("task", ""), labels.get("instance"))
        keyed[(labels["alertname"], *(a for a in about if a is not None))] = alert
    return keyed


def test_alerts_for_what_happened_are_active_and_no_others(scenario: Scenario) -> None:
    prometheus = scenario.pair.prometheus
    leader = MonitoredPair.instance(scenario.pair.leader)
    follower = MonitoredPair.instance(scenario.pair.follower)
    wanted = {
        ("MetasrvWalDataLoss", scenario.lost): "firing",
        # The stat history writer runs (and fails) on every replica.
        ("MetasrvBackgroundTaskFailing", "stat_history", leader): "firing",
        ("MetasrvBackgroundTaskFailing", "stat_history", follower): "firing",
        # for: 30m. The lost topic is blocked too: its region needs entries Kafka deleted.
        ("MetasrvTopicBlocked", scenario.blocked): "pending",
        ("MetasrvTopicBlocked", scenario.lost): "pending",
    }

    def all_active() -> dict[tuple[str, ...], dict[str, Any]] | None:
        active = _active(prometheus)
        ok = all(key in active and active[key]["state"] == s for key, s in wanted.items())
        return active if ok else None

    active = wait_until(all_active, f"alerts {wanted}", timeout=15, interval=0.2)
    assert set(active) == set(wanted), sorted(active)
    loss = active[("MetasrvWalDataLoss", scenario.lost)]
    assert loss["labels"]["severity"] == "critical"
    assert f"metasrv status --topic {scenario.lost}" in loss["annotations"]["runbook"]


def test_no_leader_alert_when_no_replica_can_be_scraped(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    prometheus = PrometheusServer.start(tmp_path, targets=[dead], rule_files=[ALERT_RULES])
    try:

        def no_leader() -> dict[str, Any] | None:
            alerts = prometheus.api("alerts")["alerts"]
            return next((a for a in alerts if a["labels"]["alertname"] == "MetasrvNoLeader"), None)

        alert = wait_until(no_leader, "MetasrvNoLeader", timeout=15, interval=0.2)
        assert alert["state"] == "pending"  # for: 1m
        assert alert["labels"]["severity"] == "critical"
        up = wait_until(
            lambda: prometheus.query("up") or None, "a scrape", timeout=10, interval=0.2
        )
        assert [s["value"][1] for s in up] == ["0"]
        assert prometheus.query("metasrv_is_leader") == []
    finally:
        prometheus.stop()


def test_dashboard_panel_ids_are_unique() -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_covers_the_purge_contract() -> None:
    board = json.loads(DASHBOARD.read_text())
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


def test_example_scrape_config_targets_both_replicas(promtool: str) -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["metasrv"]["static_configs"][0]["targets"] == ["metasrv-1:4000", "metasrv-2:4000"]
    assert jobs["metasrv"]["metrics_path"] == "/metrics"
