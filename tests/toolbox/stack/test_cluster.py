"""The production-shaped cluster (`toolbox.stack.cluster_up`): replication settings Kafka
really applies, a killed broker back in the ISR, etcd serving with a member down, `heal`."""

from __future__ import annotations

from collections.abc import Iterator

import pyetcd
import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource, ConfigSource
from typer.testing import CliRunner

from cli import app
from metasrv.kafka import KafkaAdmin
from tests._wait import wait_until
from toolbox.stack import Cluster, StackConfig, cluster_endpoints_of, process_stopped

pytestmark = pytest.mark.cluster


@pytest.fixture
def cluster(cluster_stack: Cluster) -> Iterator[Cluster]:
    """The cluster, healed after the test whatever it took down."""
    try:
        yield cluster_stack
    finally:
        cluster_stack.heal()


@pytest.fixture
def rf3_topic(cluster: Cluster, unique_prefix: str) -> Iterator[str]:
    """A new topic created with replication factor 3 and no topic-level settings."""
    admin = KafkaAdmin(cluster.kafka_bootstrap)
    name = f"{unique_prefix}-rf3"
    try:
        assert admin.ensure_topics([name], replication_factor=3, config={}) == [name]
        yield name
        # Torn down before `cluster` heals: a topic is deleted only with every broker back
        # (with one down the controller can time the deletion out).
        cluster.heal()
        admin.delete_topics([name])
    finally:
        admin.close()


def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0})
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failures.append(err)

    for i in range(count):
        producer.produce(topic, value=f"entry-{i}".encode(), on_delivery=on_delivery)
    assert producer.flush(60) == 0
    assert failures == []


def test_rf3_topic_has_three_replicas_and_an_effective_min_isr_of_2(
    cluster: Cluster, rf3_topic: str
) -> None:
    client = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    partition = client.list_topics(rf3_topic, timeout=10).topics[rf3_topic].partitions[0]
    assert sorted(partition.replicas) == [1, 2, 3]
    resource = ConfigResource(ConfigResource.Type.TOPIC, rf3_topic)
    configs = client.describe_configs([resource])[resource].result(timeout=10)
    # Not set on the topic: KRaft's cluster default (the controller's) is what applies.
    assert configs["min.insync.replicas"].value == "2"
    assert configs["min.insync.replicas"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert cluster.partition_leader(rf3_topic) in (1, 2, 3)


def test_killed_broker_leaves_the_isr_and_start_brings_it_back(
    cluster: Cluster, rf3_topic: str
) -> None:
    victim = next(n for n in (1, 2, 3) if n != cluster.partition_leader(rf3_topic))
    cluster.kill(cluster.broker_of(victim))
    assert cluster.pid(cluster.broker_of(victim)) is None
    # acks=all is satisfied by the two left (min.insync.replicas 2).
    _produce(cluster.kafka_bootstrap, rf3_topic, 200)
    wait_until(
        lambda: victim not in cluster.partition_isr(rf3_topic),
        "the dead broker fenced",
        timeout=60,
        interval=0.5,
    )

    cluster.start(cluster.broker_of(victim))
    assert cluster.pid(cluster.broker_of(victim)) is not None
    wait_until(
        lambda: cluster.partition_isr(rf3_topic) == [1, 2, 3],
        "the broker back in the ISR",
        timeout=60,
        interval=0.5,
    )


def test_killed_partition_leader_is_replaced(cluster: Cluster, rf3_topic: str) -> None:
    leader = cluster.partition_leader(rf3_topic)
    cluster.kill(cluster.broker_of(leader))
    wait_until(
        lambda: cluster.partition_leader(rf3_topic) != leader,
        "a new partition leader",
        timeout=60,
        interval=0.5,
    )
    _produce(cluster.kafka_bootstrap, rf3_topic, 50)


def _etcd_client(endpoint: str) -> pyetcd.Etcd3Client:
    host, port = endpoint.rsplit(":", 1)
    return pyetcd.client(host, int(port), timeout=5)


def test_killed_etcd_leader_leaves_the_other_two_serving(
    cluster: Cluster, unique_prefix: str
) -> None:
    leader = cluster.etcd_leader()
    cluster.kill(leader)
    others = [
        endpoint
        for name, endpoint in zip(cluster.etcd_members, cluster.etcd_endpoints, strict=True)
        if name != leader
    ]
    key = f"/{unique_prefix}/k"
    for i, endpoint in enumerate(others):

        def put_and_read(endpoint: str = endpoint, i: int = i) -> bool:
            # A fresh client each try: pyetcd retires an endpoint for minutes after one
            # timeout, and the first request may meet the election.
            client = _etcd_client(endpoint)
            try:
                client.put(key, f"v{i}")
                return bool(client.get(key)[0] == f"v{i}".encode())
            except Exception:  # grpc / pyetcd errors while the election runs
                return False
            finally:
                client.close()

        wait_until(put_and_read, f"etcd through {endpoint}", timeout=15, interval=0.5)
    assert cluster.etcd_leader() != leader

    cluster.start(leader)
    restarted = _etcd_client(cluster.etcd_endpoints[cluster.etcd_members.index(leader)])
    try:
        assert restarted.get(key)[0] == f"v{len(others) - 1}".encode()
        restarted.delete_prefix(f"/{unique_prefix}/")
    finally:
        restarted.close()


def test_heal_resumes_paused_and_starts_killed_members(cluster: Cluster) -> None:
    broker, member = cluster.brokers[0], cluster.etcd_members[1]
    paused = cluster.pid(cluster.etcd_members[2])
    cluster.kill(broker, member)
    cluster.pause(cluster.etcd_members[2])
    assert paused is not None and process_stopped(paused)
    assert not cluster.healthy()

    cluster.heal()

    assert cluster.healthy()
    assert all(cluster.pid(name) is not None for name in cluster.names)
    assert cluster.pid(cluster.etcd_members[2]) == paused and not process_stopped(paused)


def test_cluster_ports_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METASRV_STACK_CLUSTER_KAFKA_PORTS", "39192,39193,39194")
    monkeypatch.setenv("METASRV_STACK_CLUSTER_CONTROLLER_PORT", "39195")
    monkeypatch.setenv("METASRV_STACK_CLUSTER_ETCD_PORTS", "32479,32481,32483")
    cfg = StackConfig.from_env()
    assert cfg.cluster_controller_port == 39195
    assert cluster_endpoints_of(cfg).env_lines()[:3] == [
        "KAFKA_BOOTSTRAP=127.0.0.1:39192,127.0.0.1:39193,127.0.0.1:39194",
        "ETCD_ENDPOINTS=127.0.0.1:32479,127.0.0.1:32481,127.0.0.1:32483",
        "ETCD_ENDPOINT=127.0.0.1:32479",
    ]
    monkeypatch.setenv("METASRV_STACK_CLUSTER_ETCD_PORTS", "32479,32481")
    with pytest.raises(ValueError, match="3 ports"):
        StackConfig.from_env()


def test_up_and_status_cluster_print_every_endpoint(cluster: Cluster) -> None:
    state = ["--state-dir", str(cluster.cfg.state_dir)]
    up = CliRunner().invoke(app, ["stack", "up", "--cluster", *state])
    assert up.exit_code == 0, up.output
    pairs = dict(line.split("=", 1) for line in up.stdout.splitlines())
    assert pairs["KAFKA_BOOTSTRAP"] == cluster.kafka_bootstrap
    assert pairs["ETCD_ENDPOINTS"] == ",".join(cluster.etcd_endpoints)
    assert pairs["ETCD_ENDPOINT"] == cluster.etcd_endpoints[0]
    assert pairs["POSTGRES_URL"].startswith("postgresql+psycopg://")

    status = CliRunner().invoke(app, ["stack", "status", "--cluster", *state])
    assert status.exit_code == 0, status.output
    rows = {line.split()[0]: line for line in status.output.splitlines() if "(" in line}
    assert set(rows) == {"postgres", *cluster.names}
    assert all(row.rstrip().endswith("healthy") for row in rows.values())
