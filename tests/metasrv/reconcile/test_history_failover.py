"""One stat history across a failover: two `metasrv start` daemons on one etcd write the
same `[history] stats_url`; SIGKILL the leader, the survivor takes over; a reconcile then
sees both leaders' rows (a region only the first leader heard is neither stale nor
missing, a region only the second heard is there too).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import migrations
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.reconcile import RunOptions, run_reconcile
from metasrv.settings import load_settings
from metasrv.stat_history import STATS_DIR, cluster_root, writer_partition
from tests._wait import wait_until
from tests.api.conftest import heartbeat, region
from tests.api.test_failover import leader_of
from toolbox.simulator import MetasrvProcess, free_port, render_config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LEASE_SECS = 2


@pytest.fixture
def daemons(
    tmp_path: Path, unique_prefix: str, etcd_endpoint: str, kafka_bootstrap: str
) -> Iterator[dict[str, MetasrvProcess]]:
    """Two daemons (by address) sharing one kv prefix and one stats_url; both answering."""
    procs: dict[str, MetasrvProcess] = {}
    kv = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
    kafka = KafkaAdmin(kafka_bootstrap)
    try:
        for _ in range(2):
            port = free_port()
            history = f"sqlite:///{tmp_path}/history-{port}.db"
            # A daemon is ready only once its history database is at the newest migration.
            migrations.upgrade(history)
            sections: dict[str, dict[str, Any]] = {
                "wal": {
                    "broker_endpoints": [kafka_bootstrap],
                    "num_topics": 2,
                    "topic_name_prefix": f"{unique_prefix}_wal",
                    "auto_prune_interval": "0s",
                },
                "http": {"addr": f"127.0.0.1:{port}"},
                "kv": {
                    "backend": "etcd",
                    "etcd_endpoints": [etcd_endpoint],
                    "key_prefix": f"{unique_prefix}/",
                },
                "history": {
                    "url": history,
                    "stats_url": str(tmp_path / "shared-stats"),
                },
                "election": {"lease_secs": LEASE_SECS, "node_name": f"node-{port}"},
                "reconcile": {"stat_history_interval": "500ms"},
            }
            cfg = tmp_path / f"metasrv-{port}.toml"
            cfg.write_text(render_config(sections))
            proc = MetasrvProcess(cfg, tmp_path / f"metasrv-{port}.log", f"http://127.0.0.1:{port}")
            procs[f"127.0.0.1:{port}"] = proc
            proc.start(expect_leader=False)
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()
        kv.delete_prefix("")
        kv.close()
        kafka.delete_topics(t for t in kafka.list_topics() if t.startswith(unique_prefix))
        kafka.close()


def _rows_by_writer(root: str) -> dict[str, set[int]]:
    """The region ids in the stat history, by the writer partition that holds them."""
    rows = ds.dataset(f"{root}/{STATS_DIR}", format="parquet", partitioning="hive").to_table()
    by_writer: dict[str, set[int]] = {}
    for row in rows.select(["writer", "region_id"]).to_pylist():
        by_writer.setdefault(row["writer"], set()).add(row["region_id"])
    return by_writer


def _report_until_recorded(
    addr: str, regions: list[dict[str, Any]], root: str, writer: str
) -> None:
    """Heartbeat `regions` to `addr` (flushed ids moving up; all accepted) every 0.2 s
    until the stat history holds them under `writer`."""
    step = int(time.time() * 10)
    wanted = {r["region_id"] for r in regions}

    def beat_then_recorded() -> bool:
        nonlocal step
        step += 1
        body = heartbeat(1, [{**r, "flushed_entry_id": step} for r in regions])
        resp = httpx.post(f"http://{addr}/v1/heartbeat", json=body, timeout=5)
        assert resp.status_code == 200, resp.text
        assert resp.json()["rejected"] == []
        try:
            return wanted <= _rows_by_writer(root).get(writer, set())
        except (OSError, ValueError):  # no file yet (pyarrow's errors are both)
            return False

    wait_until(beat_then_recorded, f"{addr}'s regions in the stat history", interval=0.2)


def _await_leader(addr: str, timeout: float) -> None:
    def serving() -> bool:
        view = httpx.get(f"http://{addr}/v1/leader", timeout=2).json()
        return bool(view["is_leader"] and view["serving"])

    wait_until(
        serving,
        f"{addr} to take over",
        timeout=timeout,
        interval=0.1,
        ignore=(httpx.TransportError,),
    )


@pytest.mark.timeout(300)
def test_reconcile_after_failover_sees_both_leaders_rows(
    daemons: dict[str, MetasrvProcess],
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    addrs = list(daemons)
    first = leader_of(addrs, timeout=60)
    second = next(a for a in addrs if a != first)
    topics = {
        rid: httpx.post(
            f"http://{first}/v1/regions", json={"region_id": rid, "node_id": 1}, timeout=30
        ).json()["topic"]
        for rid in (1, 2, 3)
    }
    settings = load_settings(daemons[second].config, reconcile={"out_dir": str(tmp_path / "out")})
    root = cluster_root(settings)
    assert root.startswith(str(tmp_path / "shared-stats"))
    name = {addr: writer_partition(f"node-{addr.rsplit(':', 1)[1]}")[7:] for addr in addrs}
    # Region 2 reports only to the first leader, region 3 only to the second.
    _report_until_recorded(
        first, [region(1, topics[1], 0), region(2, topics[2], 0)], root, name[first]
    )
    killed = daemons[first].proc
    assert killed is not None
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(10)
    _await_leader(second, timeout=LEASE_SECS + 10)
    _report_until_recorded(
        second, [region(1, topics[1], 0), region(3, topics[3], 0)], root, name[second]
    )
    assert _rows_by_writer(root) == {name[first]: {1, 2}, name[second]: {1, 3}}

    report = run_reconcile(
        settings, RunOptions(master="local[2]", out_dir=tmp_path / "out"), spark=spark
    )
    assert report.summary["inputs"]["mapped_regions"] == 3
    assert report.summary["inputs"]["regions_reporting"] == 3
    findings = pq.read_table(report.summary["findings_path"]).to_pylist()
    about_regions = [f for f in findings if f["region_id"] in (1, 2, 3)]
    # Seen by one leader or the other, every region is accounted for: none is stale,
    # unmapped, or reported on a wrong topic.
    assert about_regions == [], about_regions
