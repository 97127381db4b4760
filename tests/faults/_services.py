"""The fault suite's own Kafka cluster and etcd cluster, which it may stop, pause and restart.

Other test sessions use the shared stack (and its cluster) at the same time, so the suite
never touches them: it runs the production-shaped cluster from the project's stack code
(`toolbox.stack.cluster_up`: a KRaft controller, brokers 1-3 at replication factor 3 and
`min.insync.replicas` 2, and a 3-member etcd) in its own state directory
(`.stack-faults/` by default, `METASRV_FAULTS_STACK_DIR` to move it) on other ports:
brokers 29192-29194, controller 29195, etcd clients 22479/22481/22483 (peers +1).

Daemons get every broker and every member. A fault names either a whole service, as the
scripted service faults do ("kafka": every broker, "etcd": every member), or one process
("kafka-broker-2", "etcd-1", ...), as faults of single brokers and members do.
"""

from __future__ import annotations

import os
from pathlib import Path

from toolbox.stack import Cluster, StackConfig, cluster_up

STATE_DIR_ENV = "METASRV_FAULTS_STACK_DIR"
KAFKA_PORTS = (29192, 29193, 29194)
CONTROLLER_PORT = 29195
ETCD_PORTS = (22479, 22481, 22483)
SERVICES = ("etcd", "kafka")


def fault_stack_config() -> StackConfig:
    """State dir and ports of the fault suite's cluster."""
    root = Path(__file__).resolve().parents[2]
    state_dir = os.environ.get(STATE_DIR_ENV) or str(root / ".stack-faults")
    return StackConfig.from_env(
        state_dir=state_dir,
        cluster_kafka_ports=KAFKA_PORTS,
        cluster_controller_port=CONTROLLER_PORT,
        cluster_etcd_ports=ETCD_PORTS,
    )


class FaultServices:
    """Start, stop, kill, pause and continue the suite's brokers and etcd members."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.cluster = Cluster(cfg)
        self.kafka = self.cluster.kafka_bootstrap
        """Every broker, "host:p1,host:p2,host:p3" (librdkafka's bootstrap form)."""
        self.etcd_endpoints = list(self.cluster.etcd_endpoints)
        """Every etcd member's client endpoint."""
        self.etcd = self.etcd_endpoints[0]
        """The first member (for callers that take one endpoint)."""
        self.paused: set[str] = set()

    def members(self, name: str) -> tuple[str, ...]:
        """The processes `name` stands for: every broker for "kafka", every member for
        "etcd", else the one named ("kafka-broker-1", "etcd-2", "kafka-controller")."""
        if name == "kafka":
            return tuple(self.cluster.brokers)
        if name == "etcd":
            return tuple(self.cluster.etcd_members)
        self.cluster.service(name)  # raises for an unknown name
        return (name,)

    def start(self, name: str) -> None:
        """Start (idempotent), then wait until every process of `name` is healthy."""
        names = self.members(name)
        self.cluster.start(*names)
        self.paused.difference_update(names)

    def stop(self, name: str) -> None:
        """Stop (SIGTERM, then SIGKILL) every process of `name`."""
        names = self.members(name)
        self.cluster.stop(*names)
        self.paused.difference_update(names)

    def kill(self, name: str) -> None:
        """SIGKILL every process of `name`."""
        names = self.members(name)
        self.cluster.kill(*names)
        self.paused.difference_update(names)

    def pause(self, name: str) -> None:
        """SIGSTOP every process of `name`."""
        names = self.members(name)
        self.cluster.pause(*names)
        self.paused.update(names)

    def resume(self, name: str) -> None:
        """SIGCONT every process of `name` (a no-op for those not paused)."""
        names = self.members(name)
        self.cluster.resume(*names)
        self.paused.difference_update(names)

    def up(self) -> None:
        """Continue paused processes and start stopped ones (the whole cluster healthy)."""
        self.cluster = cluster_up(self.cfg)
        self.paused.clear()

    def down(self) -> None:
        """Stop the whole cluster (brokers, controller, etcd members)."""
        self.cluster.down()
        self.paused.clear()
