"""Two `metasrv start` processes on one etcd: SIGKILL the leader, the other takes over.

Real processes, real etcd lease expiry: the survivor must answer heartbeats as leader
(with the topic-region map loaded, so the region is accepted) within the lease TTL + 5 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from tests.api.conftest import free_port, heartbeat, region

LEASE_SECS = 2
METASRV = str(Path(sys.executable).with_name("metasrv"))


def write_config(path: Path, port: int, prefix: str, etcd: str, kafka: str) -> None:
    path.write_text(
        f"""
[wal]
broker_endpoints = ["{kafka}"]
num_topics = 2
topic_name_prefix = "{prefix}_wal"
checkpoint_interval = "200ms"
[http]
addr = "127.0.0.1:{port}"
[kv]
backend = "etcd"
etcd_endpoints = ["{etcd}"]
key_prefix = "{prefix}/"
[history]
url = "sqlite:///{path.parent}/history-{port}.db"
[election]
lease_secs = {LEASE_SECS}
node_name = "node-{port}"
"""
    )


@pytest.fixture
def two_daemons(
    tmp_path: Path, unique_prefix: str, etcd_endpoint: str, kafka_bootstrap: str
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for _ in range(2):
            port = free_port()
            cfg = tmp_path / f"metasrv-{port}.toml"
            write_config(cfg, port, unique_prefix, etcd_endpoint, kafka_bootstrap)
            log = (tmp_path / f"metasrv-{port}.log").open("wb")
            procs[f"127.0.0.1:{port}"] = subprocess.Popen(
                [METASRV, "start", "-c", str(cfg)], stdout=log, stderr=subprocess.STDOUT
            )
        yield procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        kv = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
        kv.delete_prefix("")
        kv.close()
        kafka = KafkaAdmin(kafka_bootstrap)
        kafka.delete_topics(t for t in kafka.list_topics() if t.startswith(unique_prefix))


def leader_of(addrs: list[str], timeout: float) -> str:
    """Wait until every daemon answers and one of them is a serving leader."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = {}
        for addr in addrs:
            try:
                views[addr] = httpx.get(f"http://{addr}/v1/leader", timeout=2).json()
            except httpx.TransportError:
                break
        leaders = [a for a, v in views.items() if v["is_leader"] and v["serving"]]
        if len(views) == len(addrs) and len(leaders) == 1:
            return leaders[0]
        time.sleep(0.1)
    raise AssertionError("daemons not up with one serving leader")


@pytest.mark.faults
def test_survivor_answers_heartbeats_within_lease_ttl_plus_5s(
    two_daemons: dict[str, subprocess.Popen[bytes]],
) -> None:
    addrs = list(two_daemons)
    leader = leader_of(addrs, timeout=60)
    survivor = next(a for a in addrs if a != leader)
    # Both up: the follower refers datanodes to the leader.
    follower_view = httpx.get(f"http://{survivor}/v1/leader", timeout=5).json()
    deadline = time.monotonic() + 30
    while follower_view["leader"] != leader and time.monotonic() < deadline:
        time.sleep(0.1)
        follower_view = httpx.get(f"http://{survivor}/v1/leader", timeout=5).json()
    assert follower_view["leader"] == leader
    resp = httpx.post(f"http://{survivor}/v1/heartbeat", json=heartbeat(1, []), timeout=5)
    assert resp.status_code == 421 and resp.json()["error"]["leader"] == leader

    topic = httpx.post(
        f"http://{leader}/v1/regions", json={"region_id": 42, "node_id": 1}, timeout=30
    ).json()["topic"]
    body = heartbeat(1, [region(42, topic, 7)])
    assert (
        httpx.post(f"http://{leader}/v1/heartbeat", json=body, timeout=5).json()["rejected"] == []
    )

    os.kill(two_daemons[leader].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    two_daemons[leader].wait(10)

    answered = None
    while time.monotonic() - killed_at < LEASE_SECS + 5:
        try:
            resp = httpx.post(f"http://{survivor}/v1/heartbeat", json=body, timeout=2)
        except httpx.TransportError:
            resp = httpx.Response(599)
        if resp.status_code == 200:
            answered = resp
            break
        time.sleep(0.1)
    took = time.monotonic() - killed_at
    assert answered is not None, f"no leader answer within {LEASE_SECS + 5}s"
    assert answered.json()["leader"] == survivor
    # The new leader loaded the map: the region is known, not rejected.
    assert answered.json()["rejected"] == []
    print(f"failover: survivor answered as leader {took:.2f}s after SIGKILL")
    # And its stats are fresh in the new term: the plan sees the region's stat.
    (plan,) = httpx.get(
        f"http://{survivor}/v1/purge/plan", params={"topic": topic}, timeout=10
    ).json()["topics"]
    assert plan["blocked_by"] == []
