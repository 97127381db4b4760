"""Two `metasrv start` processes on one etcd, or on one PostgreSQL kv: one leads.

Real processes, real lease expiry (an etcd lease, or the SQL backend's lease row): after
a SIGKILL the survivor must answer heartbeats as leader (with the topic-region map
loaded, so the region is accepted) within the lease TTL + 5 s; a SIGSTOPped leader is
deposed the same way and, continued, refers callers to its successor and commits nothing.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import migrations
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from tests._wait import wait_until
from tests.api._live import produce
from tests.api.conftest import heartbeat, readyz_checks, region
from tests.metasrv.kv._pgschema import fresh_schema
from toolbox.simulator import MetasrvProcess, free_port

LEASE_SECS = 2


def write_config(path: Path, port: int, prefix: str, kv_toml: str, kafka: str) -> None:
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
{kv_toml}
[history]
url = "sqlite:///{path.parent}/history-{port}.db"
[election]
lease_secs = {LEASE_SECS}
node_name = "node-{port}"
"""
    )


@pytest.fixture(params=["etcd", "postgresql"])
def kv_toml(request: pytest.FixtureRequest, unique_prefix: str) -> Iterator[str]:
    """The `[kv]` section both daemons share: an etcd key prefix, or a migrated PostgreSQL
    schema of its own."""
    if request.param == "postgresql":
        with fresh_schema(request.getfixturevalue("postgres_url")) as url:
            migrations.upgrade(url)
            yield f'backend = "sql"\nsql_url = "{url}"'
        return
    etcd = request.getfixturevalue("etcd_endpoint")
    yield f'backend = "etcd"\netcd_endpoints = ["{etcd}"]\nkey_prefix = "{unique_prefix}/"'
    kv = EtcdKv(etcd, f"{unique_prefix}/")
    kv.delete_prefix("")
    kv.close()


@pytest.fixture
def two_daemons(
    tmp_path: Path, unique_prefix: str, kv_toml: str, kafka_bootstrap: str
) -> Iterator[dict[str, MetasrvProcess]]:
    procs: dict[str, MetasrvProcess] = {}
    try:
        for _ in range(2):
            port = free_port()
            cfg = tmp_path / f"metasrv-{port}.toml"
            write_config(cfg, port, unique_prefix, kv_toml, kafka_bootstrap)
            log = tmp_path / f"metasrv-{port}.log"
            proc = MetasrvProcess(cfg, log, f"http://127.0.0.1:{port}", new_session=False)
            procs[f"127.0.0.1:{port}"] = proc
            proc.spawn()
        yield procs
    finally:
        for proc in procs.values():
            proc.stop(timeout=20)
        kafka = KafkaAdmin(kafka_bootstrap)
        kafka.delete_topics(t for t in kafka.list_topics() if t.startswith(unique_prefix))


def leader_of(addrs: list[str], timeout: float) -> str:
    """Wait until every daemon answers and one of them is a serving leader."""

    def the_leader() -> str | None:
        views = {addr: httpx.get(f"http://{addr}/v1/leader", timeout=2).json() for addr in addrs}
        leaders = [a for a, v in views.items() if v["is_leader"] and v["serving"]]
        return leaders[0] if len(leaders) == 1 else None

    return wait_until(
        the_leader,
        "every daemon up, one a serving leader",
        timeout=timeout,
        interval=0.1,
        ignore=(httpx.TransportError,),
    )


def _heartbeat_answered(addr: str, body: dict[str, Any], timeout: float) -> httpx.Response:
    """The first 200 answer of `addr` to the heartbeat `body` (it may be down or following)."""

    def answered() -> httpx.Response | None:
        resp = httpx.post(f"http://{addr}/v1/heartbeat", json=body, timeout=2)
        return resp if resp.status_code == 200 else None

    return wait_until(
        answered,
        f"{addr} to answer a heartbeat as leader",
        timeout=timeout,
        interval=0.1,
        ignore=(httpx.TransportError,),
    )


@pytest.mark.faults
def test_survivor_answers_heartbeats_within_lease_ttl_plus_5s(
    two_daemons: dict[str, MetasrvProcess], kafka_bootstrap: str
) -> None:
    addrs = list(two_daemons)
    leader = leader_of(addrs, timeout=60)
    survivor = next(a for a in addrs if a != leader)
    # Both up: the follower refers datanodes to the leader.
    wait_until(
        lambda: httpx.get(f"http://{survivor}/v1/leader", timeout=5).json()["leader"] == leader,
        "the follower to name the leader",
        interval=0.1,
    )
    resp = httpx.post(f"http://{survivor}/v1/heartbeat", json=heartbeat(1, []), timeout=5)
    assert resp.status_code == 421 and resp.json()["error"]["leader"] == leader

    topic = httpx.post(
        f"http://{leader}/v1/regions", json={"region_id": 42, "node_id": 1}, timeout=30
    ).json()["topic"]
    # The 8 entries the region reports flushed: a report of entries the topic does not
    # hold is a topic reset (DESIGN §2 invariant 8).
    produce(kafka_bootstrap, topic, 8)
    body = heartbeat(1, [region(42, topic, 7)])
    assert (
        httpx.post(f"http://{leader}/v1/heartbeat", json=body, timeout=5).json()["rejected"] == []
    )

    os.kill(two_daemons[leader].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    two_daemons[leader].stop(10)

    answered = _heartbeat_answered(survivor, body, LEASE_SECS + 5 - (time.monotonic() - killed_at))
    took = time.monotonic() - killed_at
    assert answered.json()["leader"] == survivor
    # The new leader loaded the map: the region is known, not rejected.
    assert answered.json()["rejected"] == []
    print(f"failover: survivor answered as leader {took:.2f}s after SIGKILL")
    # And its stats are fresh in the new term: the plan sees the region's stat.
    (plan,) = httpx.get(
        f"http://{survivor}/v1/purge/plan", params={"topic": topic}, timeout=10
    ).json()["topics"]
    assert plan["blocked_by"] == []


@pytest.mark.faults
def test_a_paused_leader_is_deposed_and_commits_nothing_after_sigcont(
    two_daemons: dict[str, MetasrvProcess], tmp_path: Path
) -> None:
    addrs = list(two_daemons)
    leader = leader_of(addrs, timeout=60)
    survivor = next(a for a in addrs if a != leader)
    old = two_daemons[leader]
    old_log = tmp_path / f"metasrv-{leader.rpartition(':')[2]}.log"

    os.kill(old.pid, signal.SIGSTOP)
    paused_at = time.monotonic()
    assert leader_of([survivor], timeout=LEASE_SECS + 5) == survivor
    took = time.monotonic() - paused_at
    # The new term writes.
    created = httpx.post(
        f"http://{survivor}/v1/regions", json={"region_id": 77, "node_id": 1}, timeout=30
    )
    assert created.status_code == 201, created.text

    continued_from = old_log.stat().st_size
    os.kill(old.pid, signal.SIGCONT)
    # Continued, it still believes nothing it believed: no leader work...
    refused = httpx.post(
        f"http://{leader}/v1/regions", json={"region_id": 78, "node_id": 1}, timeout=30
    )
    assert refused.status_code == 421, refused.text

    # ...and it soon refers callers to its successor.
    def referred() -> httpx.Response | None:
        resp = httpx.post(f"http://{leader}/v1/heartbeat", json=heartbeat(1, []), timeout=5)
        return resp if resp.json()["error"].get("leader") == survivor else None

    if refused.json()["error"].get("leader") != survivor:
        refused = wait_until(
            referred, "the old leader to name its successor", timeout=LEASE_SECS + 5, interval=0.1
        )
    assert refused.status_code == 421 and refused.json()["error"]["leader"] == survivor
    assert httpx.get(f"http://{survivor}/v1/regions/78", timeout=5).status_code == 404
    assert httpx.get(f"http://{survivor}/v1/regions/77", timeout=5).status_code == 200
    after = old_log.read_bytes()[continued_from:].decode(errors="replace").splitlines()
    messages = [json.loads(line).get("msg") for line in after if line.startswith("{")]
    assert "leadership lost" in messages
    commits = {"procedure submitted", "procedure finished", "deleted WAL records", "elected leader"}
    assert commits.isdisjoint(messages), messages
    print(f"SIGSTOP: {survivor} serving {took:.2f}s after the leader was paused")


@pytest.mark.faults
def test_regions_registered_just_before_the_leader_dies_are_in_the_survivors_map(
    two_daemons: dict[str, MetasrvProcess],
) -> None:
    # The survivor serves from the map it followed while it was a follower, brought up to
    # its election's revision: a region the old leader registered a moment before it died
    # must be in it before the new leader plans a purge (DESIGN §2 invariant 4).
    addrs = list(two_daemons)
    leader = leader_of(addrs, timeout=60)
    survivor = next(a for a in addrs if a != leader)
    wait_until(
        lambda: (
            readyz_checks(httpx.get(f"http://{survivor}/readyz", timeout=5)).get("follower_map")
            == "ok"
        ),
        "the survivor's map loaded and followed",
    )
    topics = {}
    for region_id in range(100, 130):
        created = httpx.post(
            f"http://{leader}/v1/regions", json={"region_id": region_id, "node_id": 1}, timeout=30
        )
        assert created.status_code == 201, created.text
        topics[region_id] = created.json()["topic"]
    os.kill(two_daemons[leader].pid, signal.SIGKILL)
    two_daemons[leader].stop(10)

    last = max(topics)
    body = heartbeat(1, [region(last, topics[last], 7)])
    resp = _heartbeat_answered(survivor, body, LEASE_SECS + 10)
    assert resp.json()["rejected"] == []  # the last region registered is mapped
    # Every other region is mapped and, not having reported, blocks its topic's purge.
    plans = httpx.get(f"http://{survivor}/v1/purge/plan", timeout=10).json()["topics"]
    blocking = {b["region_id"] for p in plans for b in p["blocked_by"]}
    assert blocking == set(topics) - {last}
