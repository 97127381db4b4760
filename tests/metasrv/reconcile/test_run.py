"""`metasrv reconcile` end to end on real etcd, Kafka, Spark local[2] and a real metasrv.

One seeded inconsistent cluster: the plain run must report exactly the seeded findings;
`--apply` (through a running metasrv's HTTP API) must repair only the safe ones, never
touch a healthy region, and change nothing when run a second time.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from sqlalchemy import create_engine

from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.reconcile import Outcome, RunOptions, latest_run, run_reconcile
from metasrv.settings import Settings, load_settings
from metasrv.stat_history import cluster_root
from tests.metasrv.reconcile._seed import stat, write_history
from toolbox.simulator import MetasrvProcess, free_port, metasrv_argv, render_config
from toolbox.stack import StackConfig, spark_master_status, spark_master_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

OPERATOR = "op-token"
VIEWER = "view-token"


def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(count):
        producer.produce(topic, value=b"x" * 10, partition=0, key=str(i).encode())
    assert producer.flush(30) == 0


class Cluster:
    """A seeded inconsistent cluster under one unique prefix."""

    def __init__(self, tmp: Path, prefix: str, etcd: str, kafka: str) -> None:
        self.tmp = tmp
        self.prefix = prefix
        self.port = free_port()
        self.sections: dict[str, dict[str, Any]] = {
            "wal": {
                "broker_endpoints": [kafka],
                "num_topics": 3,
                "topic_name_prefix": prefix,
                "auto_prune_interval": "0s",
            },
            "kv": {"backend": "etcd", "etcd_endpoints": [etcd], "key_prefix": f"{prefix}/"},
            "history": {
                "url": f"sqlite:///{tmp / 'history.db'}",
                "stats_url": str(tmp / "stat-history"),
            },
            "http": {"addr": f"127.0.0.1:{self.port}"},
            "auth": {"operator_tokens": [OPERATOR], "viewer_tokens": [VIEWER]},
            "reconcile": {
                "stale_after": "10m",
                "history_window": "3h",
                "out_dir": str(tmp / "out"),
            },
        }
        self.config = tmp / "metasrv.toml"
        self.config.write_text(render_config(self.sections))
        self.kv = EtcdKv([etcd], f"{prefix}/")
        self.kafka = KafkaAdmin(kafka)
        self.t = [f"{prefix}_{n}" for n in range(3)]
        self.orphan = f"{prefix}_7"

    def settings(self) -> Settings:
        return load_settings(self.config)

    def seed(self, now: float) -> None:
        t0, t1, _ = self.t
        self.kafka.ensure_topics([t0, t1, self.orphan])
        # Entries 0..4 of t1 are gone: region 5 still needs them from entry 2.
        _produce(self.kafka.bootstrap, t1, 5)
        self.kafka.delete_records({t1: 5})
        self.kv.batch_put(
            [
                (keys.topic_name(t0), orjson.dumps({"pruned_entry_id": None})),
                (keys.topic_name(t1), orjson.dumps({"pruned_entry_id": None})),
                (keys.topic_region(t0, 1), keys.encode_route(1, None)),  # healthy
                (keys.topic_region(t0, 2), keys.encode_route(1, None)),  # stale for 2h
                (keys.topic_region(t1, 3), keys.encode_route(2, None)),  # reports t0
                (keys.topic_region(t1, 5), keys.encode_route(2, 1)),  # needs entries from 2
            ]
        )
        write_history(
            cluster_root(self.settings()),
            [
                (now - 7300, {2: stat(2, t0, now - 7300)}, []),
                (
                    now - 30,
                    {1: stat(1, t0, now - 31), 5: stat(5, t1, now - 32, prunable=1)},
                    [stat(3, t0, now - 33, node_id=2), stat(4, t1, now - 34, node_id=6)],
                ),
            ],
        )

    def regions(self) -> dict[str, tuple[bytes, int]]:
        return {
            kv.key: (kv.value, kv.mod_revision) for kv in self.kv.scan(keys.TOPIC_REGION_PREFIX)
        }

    def close(self) -> None:
        self.kafka.delete_topics([*self.t, self.orphan])
        self.kv.delete_prefix("")
        self.kv.close()


@pytest.fixture
def cluster(
    tmp_path: Path, unique_prefix: str, etcd_endpoint: str, kafka_bootstrap: str
) -> Iterator[Cluster]:
    c = Cluster(tmp_path, unique_prefix, etcd_endpoint, kafka_bootstrap)
    try:
        yield c
    finally:
        c.close()


def _keys(report_findings: list[dict[str, Any]]) -> set[tuple[str, str, str | None, int | None]]:
    return {(f["kind"], f["severity"], f["topic"], f["region_id"]) for f in report_findings}


@pytest.mark.timeout(600)
def test_reconcile_reports_then_repairs_safely_and_idempotently(
    spark: SparkSession, cluster: Cluster
) -> None:
    import time

    now = time.time()
    cluster.seed(now)
    t0, t1, t2 = cluster.t
    settings = cluster.settings()
    out = cluster.tmp / "out"

    report = run_reconcile(settings, RunOptions(master="local[2]", out_dir=out), spark=spark)
    engine = create_engine(settings.history.url)
    try:
        latest = latest_run(engine, limit=1000)
    finally:
        engine.dispose()
    expected = {
        ("stale_region", "warning", t0, 2),
        ("topic_mismatch", "critical", t1, 3),
        ("unmapped_region", "warning", t1, 4),
        ("retention_overrun", "critical", t1, 5),
        ("missing_topic", "warning", t2, None),
        ("orphan_topic", "info", cluster.orphan, None),
        ("skew", "warning", None, None),
    }
    assert _keys(latest["findings"]) == expected
    assert latest["run"]["run_id"] == report.run_id
    assert latest["run"]["findings_total"] == len(expected)
    summary = json.loads((report.run_dir / "summary.json").read_text())
    assert summary["counts"] == report.counts
    assert summary["inputs"]["mapped_regions"] == 4
    assert summary["inputs"]["kv_revision"] > 0
    assert (report.run_dir / "findings").is_dir()

    before = cluster.regions()
    with MetasrvProcess(
        cluster.config, cluster.tmp / "metasrv.log", f"http://127.0.0.1:{cluster.port}"
    ):
        options = RunOptions(master="local[2]", out_dir=out, apply=True, drop_stale_after=3600.0)
        first = run_reconcile(settings, options, spark=spark)
        after_first = cluster.regions()
        second = run_reconcile(settings, options, spark=spark)
        after_second = cluster.regions()

    done = {
        (r.action.kind.value, r.action.region_id)
        for r in first.actions
        if r.outcome is Outcome.DONE
    }
    assert ("register_region", 4) in done
    assert ("drop_region", 2) in done
    assert {k for k, _ in done} <= {"register_region", "drop_region", "create_topic"}
    assert first.failed_actions == 0
    # Repaired: region 4 is mapped on the topic it reports, region 2 is gone.
    assert keys.topic_region(t1, 4) in after_first
    assert keys.topic_region(t0, 2) not in after_first
    assert t2 in cluster.kafka.list_topics()
    # Healthy and unsafe-to-fix regions are untouched, byte for byte and revision.
    for key in (keys.topic_region(t0, 1), keys.topic_region(t1, 3), keys.topic_region(t1, 5)):
        assert after_first[key] == before[key]
    # The second run finds nothing safe left to fix and changes nothing.
    assert second.changes == 0
    assert after_second == after_first
    assert set(second.counts) == {"topic_mismatch", "retention_overrun", "orphan_topic", "skew"}


def test_cli_names_what_is_unreachable(
    tmp_path: Path, etcd_endpoint: str, kafka_bootstrap: str
) -> None:
    """No traceback, a non-zero exit and the name of the dead dependency."""

    def run(**sections: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        base: dict[str, dict[str, Any]] = {
            "wal": {"broker_endpoints": [kafka_bootstrap], "topic_name_prefix": "nothere"},
            "kv": {"backend": "etcd", "etcd_endpoints": [etcd_endpoint], "key_prefix": "nothere/"},
            "history": {"stats_url": str(tmp_path / "h")},
            "reconcile": {"out_dir": str(tmp_path / "o")},
        }
        for name, values in sections.items():
            base[name] = {**base[name], **values}
        cfg = tmp_path / "c.toml"
        cfg.write_text(render_config(base))
        return subprocess.run(
            metasrv_argv("reconcile", "-c", str(cfg), "--master", "spark://127.0.0.1:1"),
            capture_output=True,
            text=True,
            timeout=120,
        )

    dead_kv = run(kv={"etcd_endpoints": ["127.0.0.1:1"]})
    assert dead_kv.returncode == 3
    assert "etcd at 127.0.0.1:1 unreachable" in dead_kv.stderr
    dead_kafka = run(wal={"broker_endpoints": ["127.0.0.1:1"]})
    assert dead_kafka.returncode == 3
    assert "Kafka at 127.0.0.1:1 unreachable" in dead_kafka.stderr
    dead_master = run()
    assert dead_master.returncode == 3
    assert "Spark master spark://127.0.0.1:1 is unreachable" in dead_master.stderr
    for proc in (dead_kv, dead_kafka, dead_master):
        assert "Traceback" not in proc.stderr + proc.stdout


def _rows(findings_path: str) -> list[dict[str, Any]]:
    rows = pq.read_table(findings_path).to_pylist()
    return sorted(rows, key=lambda r: (r["kind"], str(r["topic"]), str(r["region_id"])))


@pytest.mark.timeout(600)
def test_the_standalone_cluster_finds_what_local_finds(
    spark: SparkSession, cluster: Cluster, spark_master: str
) -> None:
    """`metasrv reconcile --master spark://...` on the stack's 2-worker cluster, then the
    same inputs judged at the same instant on local[2]: identical findings, row for row."""
    import time

    cluster.seed(time.time())
    done = subprocess.run(
        metasrv_argv(
            "reconcile",
            "-c",
            str(cluster.config),
            "--master",
            spark_master,
            "--out",
            str(cluster.tmp / "standalone"),
        ),
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (cluster.tmp / "standalone").iterdir()
    remote = json.loads((run_dir / "summary.json").read_text())
    assert remote["master"] == spark_master
    stack = StackConfig.from_env()
    if spark_master == spark_master_url(stack):
        # The stack's master ran the application (on its workers' executors).
        status = spark_master_status(stack)
        assert status is not None
        apps = status.get("completedapps", []) + status.get("activeapps", [])
        assert "metasrv-reconcile" in [a["name"] for a in apps]

    local = run_reconcile(
        cluster.settings(),
        RunOptions(master="local[2]", out_dir=cluster.tmp / "local", now=remote["now"]),
        spark=spark,
    )
    assert local.counts == remote["counts"]
    assert _rows(local.summary["findings_path"]) == _rows(remote["findings_path"])
    assert len(_rows(remote["findings_path"])) == 7
