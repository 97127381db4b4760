"""Fixtures of the monitoring tests: a real Prometheus scraping a real metasrv leader and follower.

`monitored_pair` (one per module) runs two `metasrv start` replicas on etcd (a test's own key
prefix, ticker off, a 4 KiB flush trigger, the stat history pointed at a file so its writer
fails every round), whichever is elected being the leader, and a Prometheus (Debian's
package) scraping both every second with deploy/prometheus/alerts.yml loaded. Tests drive it
with simulated datanodes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from tests._wait import wait_until
from tests.deploy._prometheus import PrometheusServer, system_binary
from tests.toolbox.simulator._metasrv import VIEWER, settings, start_metasrv
from toolbox.simulator import MetasrvProcess, free_port, render_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ALERT_RULES = DEPLOY / "prometheus" / "alerts.yml"
NUM_TOPICS = 3


@dataclass(frozen=True)
class MonitoredPair:
    """Two metasrv replicas and the Prometheus scraping them (job "metasrv")."""

    leader: MetasrvProcess
    follower: MetasrvProcess
    prometheus: PrometheusServer
    prefix: str
    """Topic and key prefix; the topics are `{prefix}_0` .. `{prefix}_2`."""

    @property
    def topics(self) -> list[str]:
        return [f"{self.prefix}_{n}" for n in range(NUM_TOPICS)]

    @staticmethod
    def instance(proc: MetasrvProcess) -> str:
        """The Prometheus `instance` label of a replica (its host:port)."""
        return proc.url.removeprefix("http://")


def _is_leader(proc: MetasrvProcess) -> bool:
    answer = httpx.get(f"{proc.url}/readyz", timeout=5.0)
    return answer.status_code == 200 and answer.json().get("is_leader") is True


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of `promtool` (from the prometheus package); fails with how to install it."""
    return system_binary("promtool")


@pytest.fixture(scope="module")
def monitored_pair(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MonitoredPair]:
    """A leader, a follower and a Prometheus scraping both, torn down after the module."""
    system_binary("prometheus")  # fail before starting anything when it is missing
    tmp = tmp_path_factory.mktemp("monitored")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    kv = {"backend": "etcd", "etcd_endpoints": [etcd_endpoint], "key_prefix": f"/{prefix}/"}
    history = f"sqlite:///{tmp / 'history.db'}"
    # A regular file where the stat history wants a directory: every round of each replica's
    # stat history writer fails, so metasrv_background_task_errors_total is exported.
    not_a_dir = tmp / "stats-is-a-file"
    not_a_dir.write_text("")

    def replica(name: str, *, migrate: bool) -> MetasrvProcess:
        sections = settings(
            prefix,
            kafka_bootstrap,
            free_port(),
            kv,
            history,
            num_topics=NUM_TOPICS,
            flush_trigger_size="4KB",
            flush_wait_timeout="10s",
        )
        sections["history"]["stats_url"] = str(not_a_dir)
        sections["reconcile"] = {"stat_history_interval": "1s"}
        if migrate:
            return start_metasrv(tmp, name, sections)
        config = tmp / f"{name}.toml"  # the history database is shared and migrated once
        config.write_text(render_config(sections))
        return MetasrvProcess(config, tmp / f"{name}.log", f"http://{sections['http']['addr']}")

    replicas = [replica("replica-a", migrate=True), replica("replica-b", migrate=False)]
    # Started first: its first scrapes come seconds after it starts, while the replicas do.
    prometheus = PrometheusServer.start(
        tmp / "prometheus",
        targets=[MonitoredPair.instance(r) for r in replicas],
        rule_files=[ALERT_RULES],
        bearer_token=VIEWER,
    )
    try:
        # Both at once (2 cores: the wait is mostly imports); whichever is elected leads.
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda r: r.start(expect_leader=False), replicas))
        leader = wait_until(
            lambda: next((r for r in replicas if _is_leader(r)), None),
            "a leader",
            timeout=30,
            interval=0.2,
        )
        (follower,) = (r for r in replicas if r is not leader)
        prometheus.wait_for_targets()
        yield MonitoredPair(leader, follower, prometheus, prefix)
    finally:
        prometheus.stop()
        for r in replicas:
            r.stop()
        etcd = EtcdKv(etcd_endpoint, f"/{prefix}/")
        etcd.delete_prefix("")
        etcd.close()
        admin = KafkaAdmin(kafka_bootstrap)
        admin.delete_topics(t for t in admin.list_topics() if t.startswith(prefix))
        admin.close()
