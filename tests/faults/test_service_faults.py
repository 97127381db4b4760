"""Service faults under load: etcd restarted, etcd frozen past the lease, Kafka down.

The suite's own etcd and Kafka (tests/faults/_services.py) are stopped or SIGSTOPped
while three daemons and three datanodes run. After each fault heals the cluster must
serve again, unfinished purges must finish, purging must make progress, and every
acknowledged row must survive a crash of every datanode.
"""

from __future__ import annotations

import time

import pytest

from tests.faults._budget import FaultBudget
from tests.faults._cluster import FaultCluster
from tests.faults._services import FaultServices
from tests.faults._summary import FaultSummary

pytestmark = pytest.mark.faults

# Liveness bounds after a fault heals. Generous on purpose: on a loaded 2-core machine a
# restarted etcd or broker plus three daemons and three datanodes take a while to settle.
# They bound waiting only; the safety checks (monitor, recovery) are unaffected.
LEADER_TIMEOUT = 120.0
PROGRESS_TIMEOUT = 180.0


def test_etcd_restart(
    cluster: FaultCluster, fault_services: FaultServices, budget: FaultBudget, summary: FaultSummary
) -> None:
    for _ in range(budget.rounds):
        _, term = cluster.wait_leader()
        cluster.wait_in_flight(timeout=10)
        markers = dict(cluster.monitor.markers)
        fault_services.stop("etcd")
        summary.fault()
        cluster.run_for(1.0)
        fault_services.start("etcd")
        interrupted = sorted(cluster.unfinished())
        leader, new_term = cluster.wait_leader(timeout=LEADER_TIMEOUT)
        # Only a new term resumes; a leader whose lease survived the restart just goes on.
        cluster.finish_resumed(interrupted, count=new_term != term)
        print(f"etcd restart: {leader.name} leads (term changed: {new_term != term})")
        cluster.wait_purge_progress(markers, timeout=PROGRESS_TIMEOUT)
        cluster.run_for(budget.settle)
    cluster.assert_recovers()


def test_etcd_frozen_longer_than_lease(
    cluster: FaultCluster, fault_services: FaultServices, budget: FaultBudget, summary: FaultSummary
) -> None:
    lease = cluster.spec.lease_secs
    assert budget.etcd_pause > lease + 1
    for _ in range(budget.rounds):
        _, term = cluster.wait_leader()
        cluster.wait_in_flight(timeout=10)
        markers = dict(cluster.monitor.markers)
        fault_services.pause("etcd")
        summary.fault()
        time.sleep(lease + 1.0)
        # Cut off from etcd, no process may still believe it leads once its lease is over.
        leading = {n: v for n, v in cluster.views().items() if v.get("is_leader")}
        assert leading == {}, leading
        time.sleep(max(0.0, budget.etcd_pause - lease - 1.0))
        fault_services.resume("etcd")
        interrupted = sorted(cluster.unfinished())
        leader, _ = cluster.wait_leader(timeout=LEADER_TIMEOUT, after_term=term)
        cluster.finish_resumed(interrupted)
        print(f"etcd frozen {budget.etcd_pause:.0f}s: {leader.name} leads in a new term")
        cluster.wait_purge_progress(markers, timeout=PROGRESS_TIMEOUT)
        cluster.run_for(budget.settle)
    cluster.assert_recovers()


def test_kafka_broker_down(
    cluster: FaultCluster, fault_services: FaultServices, budget: FaultBudget, summary: FaultSummary
) -> None:
    for _ in range(budget.rounds):
        cluster.wait_in_flight(timeout=10)
        fault_services.stop("kafka")
        summary.fault()
        down_at = time.monotonic()
        cluster.run_for(budget.kafka_outage)
        # Heartbeats need no Kafka: the cluster keeps a serving leader through the outage.
        cluster.wait_leader(timeout=LEADER_TIMEOUT)
        markers = dict(cluster.monitor.markers)
        fault_services.start("kafka")
        print(f"Kafka down for {time.monotonic() - down_at:.1f}s (stop, wait, start)")
        cluster.wait_purge_progress(markers, timeout=PROGRESS_TIMEOUT)
        cluster.run_for(budget.settle)
    cluster.assert_recovers()
