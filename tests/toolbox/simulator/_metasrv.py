"""Helpers to run a real `metasrv start` child in the simulator tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolbox.simulator import MetasrvProcess, migrate, render_config

OPERATOR, DATANODE, VIEWER = "op-token", "dn-token", "viewer-token"


def settings(
    prefix: str, kafka: str, port: int, kv: dict[str, Any], history: str, **wal: Any
) -> dict[str, dict[str, Any]]:
    """Config sections of a metasrv with the ticker off (`wal` overrides that section)."""
    return {
        "wal": {
            "broker_endpoints": [kafka],
            "num_topics": 2,
            "topic_name_prefix": prefix,
            "auto_prune_interval": "0s",  # purges only when a test asks
            "region_stat_ttl": "30s",
            **wal,
        },
        "procedure": {"retry_delay": "100ms"},
        "http": {"addr": f"127.0.0.1:{port}"},
        "kv": kv,
        "history": {"url": history},
        "auth": {
            "datanode_tokens": [DATANODE],
            "operator_tokens": [OPERATOR],
            "viewer_tokens": [VIEWER],
        },
        "election": {"lease_secs": 2, "node_name": f"test-{port}"},
    }


def start_metasrv(tmp: Path, name: str, sections: dict[str, dict[str, Any]]) -> MetasrvProcess:
    """Write the config, migrate its databases; the process is not started yet."""
    config = tmp / f"{name}.toml"
    config.write_text(render_config(sections))
    migrate(config, tmp / f"{name}-migrate.log")
    return MetasrvProcess(config, tmp / f"{name}.log", f"http://{sections['http']['addr']}")
