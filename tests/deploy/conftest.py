"""Fixtures of the monitoring tests: a real Prometheus scraping a real metasrv leader and follower.

`monitored_pair` (one per module) runs two `metasrv start` replicas on etcd (a test's own key
prefix, ticker off, a 4 KiB flush trigger, the stat history pointed at a file so its writer
fails every round) and a Prometheus (Debian's package) scraping both every second with
deploy/prometheus/alerts.yml loaded. Tests drive it with simulated datanodes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from tests.deploy._prometheus import PrometheusServer, system_binary
from tests.toolbox.simulator._metasrv import VIEWER, settings, start_metasrv
from toolbox.simulator import MetasrvProcess, free_port

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
    # A regular file where the stat history wants a directory: every round of the leader's
    # stat history writer fails, so metasrv_background_task_errors_total is exported.
    not_a_dir = tmp / "stats-is-a-file"
    not_a_dir.write_text("")

    def replica(name: str) -> MetasrvProcess:
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
        return start_metasrv(tmp, name, sections)

    leader, follower = replica("leader"), replica("follower")
    # Started first: its first scrapes come seconds after it starts, while the replicas do.
    prometheus = PrometheusServer.start(
        tmp / "prometheus",
        targets=[MonitoredPair.instance(leader), MonitoredPair.instance(follower)],
        rule_files=[ALERT_RULES],
        bearer_token=VIEWER,
    )
    try:
        leader.start()
        follower.start(expect_leader=False)
        prometheus.wait_for_targets()
        yield MonitoredPair(leader, follower, prometheus, prefix)
    finally:
        prometheus.stop()
        follower.stop()
        leader.stop()
        etcd = EtcdKv(etcd_endpoint, f"/{prefix}/")
        etcd.delete_prefix("")
        etcd.close()
        admin = KafkaAdmin(kafka_bootstrap)
        admin.delete_topics(t for t in admin.list_topics() if t.startswith(prefix))
        admin.close()
