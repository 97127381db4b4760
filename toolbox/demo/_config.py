"""What the demo runs (`DemoOptions`), where it finds the services, and the metasrv and
archiver configs it writes for them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolbox.simulator import render_config
from toolbox.stack import S3Endpoint

NUM_TOPICS = 4
STAT_TTL = 10.0
PRUNE_INTERVAL = 10.0
ARCHIVE_DELAY = 2.0
"""`[wal.archive] object_max_delay` in seconds: the archiver writes an object at least this
often, so its committed offset (which bounds every purge) trails the WAL by seconds."""


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
    """Where the demo's metasrv, archiver and datanodes find Kafka, etcd, PostgreSQL and S3."""

    kafka_bootstrap: str
    """Every broker, comma-separated."""
    etcd_endpoints: list[str]
    postgres_url: str
    s3: S3Endpoint
    replication_factor: int = 1


def archive_section(s3: S3Endpoint, run_id: str) -> dict[str, object]:
    """The demo's `[wal.archive]`: the stack's bucket, under a prefix and a consumer group of
    this run's own (the stack is shared), objects every `ARCHIVE_DELAY` seconds, none
    deleted by retention (the demo removes its prefix when it ends)."""
    return {
        "enabled": True,
        "endpoint": s3.endpoint,
        "bucket": s3.bucket,
        "prefix": f"demo-{run_id}/",
        "access_key_id": s3.access_key_id,
        "secret_access_key": s3.secret_access_key,
        "consumer_group": f"demo_{run_id}_archive",
        "object_max_bytes": "1MB",
        "object_max_delay": f"{ARCHIVE_DELAY:.0f}s",
        "retention": "0s",
    }


def _wal_section(services: DemoServices, run_id: str) -> dict[str, object]:
    durability: dict[str, object] = {}
    if services.replication_factor > 1:
        durability = {
            "replication_factor": services.replication_factor,
            "min_insync_replicas": 2,
        }
    return {
        "broker_endpoints": services.kafka_bootstrap.split(","),
        **durability,
        "num_topics": NUM_TOPICS,
        "topic_name_prefix": f"demo_{run_id}",
        "auto_prune_interval": f"{PRUNE_INTERVAL:.0f}s",
        "region_stat_ttl": f"{STAT_TTL:.0f}s",
        "flush_trigger_size": "256KB",
        "flush_wait_timeout": "10s",
        "checkpoint_interval": "2s",
    }


def demo_config(services: DemoServices, *, run_id: str, port: int, tokens: dict[str, str]) -> str:
    """The demo's metasrv config: etcd kv under a unique prefix, PostgreSQL history, the WAL
    archive enabled (so its consumer group is pinned: no purge passes what it archived)."""
    return render_config(
        {
            "wal": _wal_section(services, run_id),
            "wal.archive": archive_section(services.s3, run_id),
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


def archiver_config(services: DemoServices, *, run_id: str, port: int) -> str:
    """The config of the demo's one archiver (`metasrv archive -c FILE`): the metasrv's `[wal]`
    and `[wal.archive]`, its own `[http] addr` for /metrics and /readyz."""
    return render_config(
        {
            "wal": _wal_section(services, run_id),
            "wal.archive": archive_section(services.s3, run_id),
            "http": {"addr": f"127.0.0.1:{port}"},
        }
    )
