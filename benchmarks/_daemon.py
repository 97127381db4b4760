"""A benchmark's `metasrv start` child on the 3-broker cluster (`toolbox.stack.cluster_up`):
the config sections every such daemon shares, and the removal of its etcd keys afterwards.

Each daemon has its own `prefix`: its WAL topics are `{prefix}_{n}`, its etcd keys sit under
`{prefix}/`, its history database and stats files in the benchmark's work directory.
"""

from __future__ import annotations

import base64
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from _results import log

if TYPE_CHECKING:
    from toolbox.stack import Cluster


def wal_section(cluster: Cluster, prefix: str, num_topics: int) -> dict[str, Any]:
    """`[wal]` of a pool of `num_topics` topics `{prefix}_{n}` at replication factor 3."""
    return {
        "broker_endpoints": cluster.kafka_bootstrap.split(","),
        "num_topics": num_topics,
        "topic_name_prefix": prefix,
        "replication_factor": 3,
    }


def daemon_sections(
    cluster: Cluster, workdir: Path, prefix: str, addr: str, wal: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """A daemon's config (`render_config`'s input): `wal`, regions' stats kept an hour and no
    size-triggered flush (a benchmark's regions report when it says), `[http] addr`, etcd kv
    on every cluster member under `{prefix}/`, history in `workdir`, no stat history."""
    return {
        "wal": {**wal, "region_stat_ttl": "1h", "flush_trigger_size": "1GB"},
        "http": {"addr": addr},
        "kv": {
            "backend": "etcd",
            "etcd_endpoints": list(cluster.etcd_endpoints),
            "key_prefix": f"{prefix}/",
        },
        "history": {
            "url": f"sqlite:///{workdir / (prefix + '-history.db')}",
            "stats_url": str(workdir / f"{prefix}-stats"),
        },
        "election": {"node_name": "bench", "lease_secs": 5},
        "reconcile": {"stat_history_interval": "0s"},
    }


def remove_keys(cluster: Cluster, prefix: str) -> None:
    """Delete every etcd key under `{prefix}/` (through the first member that answers); a
    clean-up, so a failure is logged, not raised."""
    key = f"{prefix}/".encode()
    range_end = key[:-1] + bytes([key[-1] + 1])
    body = {
        "key": base64.b64encode(key).decode(),
        "range_end": base64.b64encode(range_end).decode(),
    }
    for endpoint in cluster.etcd_endpoints:
        with contextlib.suppress(httpx.HTTPError):
            url = f"http://{endpoint}/v3/kv/deleterange"
            if httpx.post(url, json=body, timeout=10).status_code == 200:
                return
    log(f"cleanup: etcd keys under {prefix}/ not removed")
