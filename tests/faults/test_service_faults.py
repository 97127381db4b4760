"""Service faults under load: etcd restarted, etcd frozen past the lease, Kafka down.

The suite's own etcd and Kafka (tests/faults/_services.py) are stopped or SIGSTOPped
while three daemons and three datanodes run. After each fault heals the cluster must
serve again, unfinished purges must finish, purging must make progress, and every
acknowledged row must survive a crash of every datanode.
"""

from __future__ import annotations

import time

import pytest

from tests._wait import wait_until
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
        paused_at = time.monotonic()
        summary.fault()
        # Cut off from etcd, no process may still believe it leads once its lease is over
        # (every renewal it made was sent before the pause); none can win a new one.
        try:
            wait_until(
                lambda: not _leading(cluster),
                "every lease to lapse",
                timeout=lease + 1.0,
                interval=0.2,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; leading: {_leading(cluster)}") from None
        # The fault itself is a duration: etcd stays frozen for `etcd_pause` seconds.
        cluster.run_for(max(0.0, paused_at + budget.etcd_pause - time.monotonic()))
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


def _leading(cluster: FaultCluster) -> dict[str, object]:
    """`GET /v1/leader` of each daemon that believes it leads, by name."""
    return {n: v for n, v in cluster.views().items() if v.get("is_leader")}


def _busiest_broker(fault_services: FaultServices, topics: list[str]) -> str:
    """The broker leading the most of `topics`' partitions."""
    cluster = fault_services.cluster
    leaders = [cluster.partition_leader(t) for t in topics]
    node = max(set(leaders), key=leaders.count)
    return cluster.broker_of(node)


def test_partition_leader_killed_then_a_follower_paused(
    cluster: FaultCluster, fault_services: FaultServices, budget: FaultBudget, summary: FaultSummary
) -> None:
    """RF 3, min ISR 2: one broker lost at a time. With the broker leading most WAL
    partitions SIGKILLed, Kafka elects new leaders and purges go on (no purge waits for the
    dead broker, none is skipped for a false reason); with a follower SIGSTOPped, a purge's
    DeleteRecords waits for it but the log start decides, and purges still complete."""
    topics = cluster.workload.topics
    for _ in range(budget.rounds):
        cluster.wait_in_flight(timeout=10)
        victim = _busiest_broker(fault_services, topics)
        fault_services.kill(victim)
        summary.fault()
        killed_at = time.monotonic()
        markers = dict(cluster.monitor.markers)
        cluster.wait_purge_progress(markers, timeout=PROGRESS_TIMEOUT)
        print(f"{victim} killed: purged again after {time.monotonic() - killed_at:.1f}s")
        fault_services.start(victim)

        leader_node = fault_services.cluster.partition_leader(topics[0])
        follower = next(
            b
            for b in fault_services.cluster.brokers
            if b != fault_services.cluster.broker_of(leader_node)
        )
        cluster.wait_in_flight(timeout=10)
        markers = dict(cluster.monitor.markers)
        fault_services.pause(follower)
        summary.fault()
        try:
            cluster.run_for(budget.kafka_outage)
        finally:
            fault_services.resume(follower)
        cluster.wait_purge_progress(markers, timeout=PROGRESS_TIMEOUT)
        cluster.run_for(budget.settle)
    cluster.assert_recovers()


def test_etcd_member_killed_follower_then_leader(
    cluster: FaultCluster, fault_services: FaultServices, budget: FaultBudget, summary: FaultSummary
) -> None:
    """A 3-member etcd loses one member at a time, a follower and then the etcd leader:
    a serving metasrv leader answers throughout (within the lease), purges go on, and
    nothing a region needs is deleted."""
    etcd = fault_services.cluster
    for _ in range(budget.rounds):
        leader_member = etcd.etcd_leader()
        follower_member = next(m for m in etcd.etcd_members if m != leader_member)
        for member in (follower_member, leader_member):
            cluster.wait_in_flight(timeout=10)
            markers = dict(cluster.monitor.markers)
            fault_services.kill(member)
            summary.fault()
            killed_at = time.monotonic()
            leader, _ = cluster.wait_leader(timeout=cluster.spec.lease_secs + 5.0)
            print(
                f"{member} killed: {leader.name} serving {time.monotonic() - killed_at:.1f}s later"
            )
            cluster.wait_purge_progress(markers, timeout=PROGRESS_TIMEOUT)
            fault_services.start(member)
            cluster.run_for(budget.settle)
    cluster.finish_resumed(sorted(cluster.unfinished()), count=False)
    cluster.assert_recovers()
