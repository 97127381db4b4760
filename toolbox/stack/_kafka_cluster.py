"""A production-shaped Kafka cluster: one dedicated KRaft controller and three brokers.

The nodes run the jars the single-node Kafka installs (`<state dir>/kafka/libs`, downloaded
once) and keep their config, data, log and pid file under `<state dir>/cluster/<node>/`:

    kafka-controller/   node id 0, process.roles=controller   cluster_controller_port
    kafka-broker-i/     node id i (1..3), process.roles=broker   cluster_kafka_ports[i-1]

Durability is set where KRaft reads it: `min.insync.replicas` on the controller too, because
the controller applies its own cluster default when a topic is created without the setting.
"""

from __future__ import annotations

import threading
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from toolbox.stack._config import StackConfig
from toolbox.stack._kafka import (
    Kafka,
    format_storage,
    java_argv,
    new_cluster_id,
    write_log4j2,
)
from toolbox.stack._process import spawn
from toolbox.stack._service import Service

CONTROLLER_ID = 0
CONTROLLER_NAME = "kafka-controller"
BROKER_IDS = (1, 2, 3)

# Both roles: the controller applies the replication defaults at topic creation, the
# brokers at their internal topics and in their own validation.
_DURABILITY = {
    "num.partitions": "1",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "auto.create.topics.enable": "false",
    "delete.topic.enable": "true",
    "group.initial.rebalance.delay.ms": "0",
    # Small segments so DeleteRecords / retention tests see whole segments go.
    "log.segment.bytes": str(1024 * 1024),
    "log.retention.check.interval.ms": "5000",
    "log.segment.delete.delay.ms": "1000",
    # Four JVMs share two cores.
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "background.threads": "2",
}


def broker_name(node_id: int) -> str:
    """Service name of the broker with `node_id`."""
    return f"kafka-broker-{node_id}"


_cluster_id_guard = threading.Lock()


def _cluster_id(cfg: StackConfig) -> str:
    """The cluster id every node is formatted with, made once per state dir (nodes are
    formatted in parallel threads, under the cluster's directory lock)."""
    with _cluster_id_guard:
        return _read_or_make_cluster_id(cfg)


def _read_or_make_cluster_id(cfg: StackConfig) -> str:
    path = cfg.cluster_dir / "kafka-cluster.id"
    if path.exists():
        return path.read_text().strip()
    # A node formatted before the id file was lost keeps its id: reuse it.
    for meta in cfg.cluster_dir.glob("kafka-*/data/meta.properties"):
        for line in meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                found = line.split("=", 1)[1].strip()
                path.write_text(found + "\n")
                return found
    made = new_cluster_id()
    cfg.cluster_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(made + "\n")
    return made


class KafkaNode(Service):
    """One KRaft node of the cluster (the controller or a broker)."""

    stop_grace = 45.0
    heap = "-Xmx256m"

    def __init__(self, cfg: StackConfig, name: str, node_id: int) -> None:
        self.name = name
        self.node_id = node_id
        super().__init__(cfg)
        self.dir = cfg.cluster_dir / name
        self.pid_file = self.dir / f"{name}.pid"

    @property
    def endpoint(self) -> str:
        return f"{self.cfg.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.dir / "kafka.log"

    @property
    def libs(self) -> Path:
        """The single-node Kafka's jar directory (installed once, shared)."""
        return Kafka(self.cfg).libs

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def properties(self) -> Path:
        return self.dir / "server.properties"

    def _props(self) -> dict[str, str]:
        c = self.cfg
        return {
            "node.id": str(self.node_id),
            "controller.quorum.voters": f"{CONTROLLER_ID}@{c.host}:{c.cluster_controller_port}",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self.data),
            **_DURABILITY,
        }

    def install(self) -> None:
        """Write the config and format the storage once (the jars must be installed)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.properties.write_text("".join(f"{k}={v}\n" for k, v in self._props().items()))
        write_log4j2(self.dir)
        if not (self.data / "meta.properties").exists():
            format_storage(
                self.dir,
                self.libs,
                self.properties,
                _cluster_id(self.cfg),
                log_file=self.log_file,
            )

    def launch(self) -> None:
        argv = java_argv(self.dir, self.libs, "kafka.Kafka", str(self.properties), heap=self.heap)
        spawn(argv, log_file=self.log_file, pid_file=self.pid_file, cwd=self.dir)


class KafkaController(KafkaNode):
    """The cluster's single KRaft controller (the metadata quorum)."""

    heap = "-Xmx256m -Xms64m"

    def __init__(self, cfg: StackConfig) -> None:
        super().__init__(cfg, CONTROLLER_NAME, CONTROLLER_ID)

    @property
    def port(self) -> int:
        return self.cfg.cluster_controller_port

    def _props(self) -> dict[str, str]:
        c = self.cfg
        return {
            **super()._props(),
            "process.roles": "controller",
            "listeners": f"CONTROLLER://{c.host}:{c.cluster_controller_port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
        }

    def healthy(self, timeout: float = 5.0) -> bool:
        """Its listener accepts connections (brokers prove the quorum by registering)."""
        return self.listening()


class KafkaBroker(KafkaNode):
    """Broker `node_id` (1..3)."""

    heap = "-Xmx512m -Xms128m"

    def __init__(self, cfg: StackConfig, node_id: int) -> None:
        super().__init__(cfg, broker_name(node_id), node_id)

    @property
    def port(self) -> int:
        return self.cfg.cluster_kafka_ports[self.node_id - 1]

    def _props(self) -> dict[str, str]:
        return {
            **super()._props(),
            "process.roles": "broker",
            "listeners": f"PLAINTEXT://{self.endpoint}",
            "advertised.listeners": f"PLAINTEXT://{self.endpoint}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        }

    def healthy(self, timeout: float = 5.0) -> bool:
        """The broker's own metadata lists it: registered with the controller and unfenced
        (KRaft leaves fenced brokers out of metadata answers)."""
        return self.node_id in registered_brokers(self.endpoint, timeout)


def admin_client(bootstrap: str, timeout: float) -> AdminClient:
    """A quiet admin client (dead brokers in `bootstrap` are expected while testing faults)."""
    return AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "socket.timeout.ms": int(timeout * 1000),
            "reconnect.backoff.max.ms": 1000,
            "log_level": 0,
        }
    )


def registered_brokers(bootstrap: str, timeout: float = 5.0) -> set[int]:
    """Node ids of the unfenced brokers the cluster's metadata names (empty if none answers)."""
    try:
        md = admin_client(bootstrap, timeout).list_topics(timeout=timeout)
    except KafkaException:
        return set()
    return set(md.brokers)


def kafka_nodes(cfg: StackConfig) -> list[KafkaNode]:
    """The controller, then brokers 1..3, in start order."""
    return [KafkaController(cfg), *(KafkaBroker(cfg, i) for i in BROKER_IDS)]
