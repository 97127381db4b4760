"""What the demo runs (`DemoOptions`), where it finds the services, and the metasrv config it
writes for them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolbox.simulator import render_config

NUM_TOPICS = 4
STAT_TTL = 10.0
PRUNE_INTERVAL = 10.0


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What the demo runs."""

    nodes: int = 3
    regions_per_node: int = 8
    write_rate: float = 200.0
    """Rows per second over all regions."""
    phase_seconds: float = 30.0
    """Length of each writing phase (there are two, plus the outage)."""
    seed: int = 7
    keep_running: bool = False
    """Leave metasrv and the datanodes running until Ctrl-C."""
    run_dir: Path | None = None
    """Where config, logs and datanode data go (default: a new temp dir)."""
    cluster: bool = False
    """Run on the 3-broker, 3-member cluster and kill a partition leader while purging."""


@dataclass(frozen=True, slots=True)
class DemoServices:
    """Where the demo's metasrv and datanodes find Kafka, etcd and PostgreSQL."""

    kafka_bootstrap: str
    """Every broker, comma-separated."""
    etcd_endpoints: list[str]
    postgres_url: str
    replication_factor: int = 1


def demo_config(services: DemoServices, *, run_id: str, port: int, tokens: dict[str, str]) -> str:
    """The demo's metasrv config: etcd kv under a unique prefix, PostgreSQL history."""
    durability: dict[str, object] = {}
    if services.replication_factor > 1:
        durability = {
            "replication_factor": services.replication_factor,
            "min_insync_replicas": 2,
        }
    return render_config(
        {
            "wal": {
                "broker_endpoints": services.kafka_bootstrap.split(","),
                **durability,
                "num_topics": NUM_TOPICS,
                "topic_name_prefix": f"demo_{run_id}",
                "auto_prune_interval": f"{PRUNE_INTERVAL:.0f}s",
                "region_stat_ttl": f"{STAT_TTL:.0f}s",
                "flush_trigger_size": "256KB",
                "flush_wait_timeout": "10s",
                "checkpoint_interval": "2s",
            },
            "procedure": {"retry_delay": "200ms"},
            "http": {"addr": f"127.0.0.1:{port}"},
            "kv": {
                "backend": "etcd",
                "etcd_endpoints": services.etcd_endpoints,
                "key_prefix": f"/metasrv-demo/{run_id}/",
            },
            "history": {"url": services.postgres_url},
            "auth": {
                "datanode_tokens": [tokens["datanode"]],
                "operator_tokens": [tokens["operator"]],
                "viewer_tokens": [tokens["viewer"]],
                "open_read": True,
            },
            "election": {"lease_secs": 5, "node_name": f"demo-{run_id}"},
        }
    )
