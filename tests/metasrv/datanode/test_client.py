"""`metasrv.datanode` against real `metasrv start` processes (etcd kv, Kafka): a 421 is
followed to the leader, datanodes reach a new leader after a SIGKILL with their retries
spread by jitter, and a flush instruction reaches the database's callback and is reported.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from metasrv.datanode import (
    CONTENT_TYPES,
    HEARTBEAT_PATH,
    AsyncDatanodeClient,
    DatanodeClient,
    HeartbeatLoop,
    RegionReport,
    TopicReport,
)
from metasrv.datanode import Heartbeat as HeartbeatBody
from metasrv.errors import NotFound, NotLeader
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.wire import HeartbeatResponse, MetasrvClient
from tests._wait import wait_until
from tests.metasrv.datanode._vectors import DIR as VECTORS_DIR
from tests.metasrv.datanode._vectors import VECTORS, read_hex
from tests.procedures._harness import produce
from tests.toolbox.simulator._metasrv import DATANODE, OPERATOR, VIEWER, settings, start_metasrv
from toolbox.simulator import MetasrvProcess, free_port

LEASE_SECS = 2  # tests.toolbox.simulator._metasrv.settings
VIEWING = {"Authorization": f"Bearer {VIEWER}"}


@dataclass
class Cluster:
    leader: MetasrvProcess
    follower: MetasrvProcess
    prefix: str

    @property
    def addrs(self) -> list[str]:
        return [self.leader.url, self.follower.url]


def settled(procs: list[MetasrvProcess], prefix: str, timeout: float = 30.0) -> Cluster:
    """The two processes once one serves as leader and the other names it."""

    def settled_now() -> Cluster | None:
        views = {}
        for proc in procs:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                answer = httpx.get(f"{proc.url}/v1/leader", headers=VIEWING, timeout=2)
                views[proc.url] = answer.json()
        leaders = [p for p in procs if views.get(p.url, {}).get("serving") is True]
        if len(views) == 2 and len(leaders) == 1:
            (leader,) = leaders
            (follower,) = [p for p in procs if p is not leader]
            named = views[follower.url].get("leader") or ""
            if named and leader.url.endswith(named):
                return Cluster(leader, follower, prefix)
        return None

    return wait_until(settled_now, "one leader the other names", timeout=timeout, interval=0.1)


@contextlib.contextmanager
def two_metasrvs(kafka: str, etcd: str, prefix: str, tmp: Path) -> Iterator[Cluster]:
    """Two metasrv processes on one etcd (ticker off, a 4 KB flush trigger): one leads."""
    kv = {"backend": "etcd", "etcd_endpoints": [etcd], "key_prefix": f"/{prefix}/"}
    history = f"sqlite:///{tmp / 'h.db'}"
    procs = [
        start_metasrv(
            tmp,
            name,
            settings(
                prefix,
                kafka,
                free_port(),
                kv,
                history,
                num_topics=1,
                flush_trigger_size="4KB",
                flush_wait_timeout="20s",
            ),
        )
        for name in ("a", "b")
    ]
    try:
        procs[0].start()
        procs[1].start(expect_leader=False)
        yield settled(procs, prefix)
    finally:
        for proc in procs:
            proc.stop()
        store = EtcdKv(etcd, f"/{prefix}/")
        store.delete_prefix("")
        store.close()
        admin = KafkaAdmin(kafka)
        admin.delete_topics(t for t in admin.list_topics() if t.startswith(prefix))
        admin.close()


@pytest.fixture(scope="module")
def shared(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A cluster the tests that kill nothing share (each uses its own regions)."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    tmp = tmp_path_factory.mktemp("shared")
    with two_metasrvs(kafka_bootstrap, etcd_endpoint, prefix, tmp) as cluster:
        yield cluster


@pytest.fixture
def cluster(
    kafka_bootstrap: str, etcd_endpoint: str, unique_prefix: str, tmp_path: Path
) -> Iterator[Cluster]:
    """A cluster of the test's own (it kills its leader)."""
    with two_metasrvs(kafka_bootstrap, etcd_endpoint, unique_prefix, tmp_path) as cluster:
        yield cluster


def register(cluster: Cluster, *region_ids: int, topic: str | None = None, node_id: int = 1) -> str:
    """Register the regions on `node_id` (the datanode whose reports are trusted)."""
    with MetasrvClient(cluster.leader.url, token=OPERATOR, timeout=30) as operator:
        topics = {operator.add_region(r, node_id, topic).topic for r in region_ids}
    (topic,) = topics
    return topic


def body(node_id: int, region_id: int, topic: str, flushed: int = 5) -> HeartbeatBody:
    region = RegionReport(region_id, topic, flushed, memtable_bytes=100)
    return HeartbeatBody(node_id=node_id, regions=[region])


@pytest.mark.parametrize("encoding", ["json", "columns"])
def test_a_heartbeat_sent_to_a_follower_follows_its_421_to_the_leader(
    shared: Cluster, encoding: Any
) -> None:
    region = (5 << 32) | 1
    topic = register(shared, region)
    # Only the follower is configured: the leader is learned from the 421.
    with DatanodeClient(shared.follower.url, token=DATANODE, encoding=encoding) as client:
        answer = client.heartbeat(body(1, region, topic))
        assert answer.rejected == []
        assert client.current == shared.leader.url
        assert client.addresses == [shared.follower.url, shared.leader.url]
        assert client.replay_start(region) == 6  # flushed 5, no purge yet
        whole = client.replay_answer(region)
        assert (whole.topic, whole.start_entry_id) == (topic, 6)
        assert (whole.log_start_offset, whole.archive) == (0, None)  # nothing deleted
        with pytest.raises(NotFound):
            client.replay_start(region + 1)
    with MetasrvClient(shared.leader.url, token=OPERATOR) as operator:
        assert operator.region(region).stat is not None


def test_without_following_the_follower_only_refers(shared: Cluster) -> None:
    """The same heartbeat without the leader's address followed fails: the 421 is what
    the client acted on above."""
    region = (5 << 32) | 2
    topic = register(shared, region)
    with (
        MetasrvClient(shared.follower.url, token=DATANODE, follow_leader=False) as plain,
        pytest.raises(NotLeader) as refused,
    ):
        plain.heartbeat(msgspec.to_builtins(body(1, region, topic)))
    assert refused.value.leader is not None
    assert shared.leader.url.endswith(refused.value.leader)


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_every_vector_is_accepted_over_http_in_both_encodings(shared: Cluster, name: str) -> None:
    """The vectors' bytes as a datanode sends them: 200, every region judged (none of them
    is registered, so each is rejected by name, nothing else)."""
    meaning = VECTORS[name]
    json_body = (VECTORS_DIR / f"{name}.json").read_bytes()
    columns = read_hex(VECTORS_DIR / f"{name}.msgpack.hex")
    expected = {(r["region_id"], "unknown_region") for r in meaning["regions"]}
    headers = {"Authorization": f"Bearer {DATANODE}"}
    for content, content_type in (
        (json_body, "application/json"),
        (columns, CONTENT_TYPES["columns"]),
    ):
        answer = httpx.post(
            f"{shared.leader.url}{HEARTBEAT_PATH}",
            content=content,
            headers={**headers, "content-type": content_type},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        assert {(r["region_id"], r["reason"]) for r in answer.json()["rejected"]} == expected


async def test_the_async_client_follows_the_421_too(shared: Cluster) -> None:
    region = (5 << 32) | 3
    topic = register(shared, region, node_id=2)
    async with AsyncDatanodeClient([shared.follower.url], token=DATANODE) as client:
        answer = await client.heartbeat(body(2, region, topic))
        assert answer.rejected == []
        assert client.current == shared.leader.url
        assert await client.replay_start(region) == 6
        whole = await client.replay_answer(region)
        assert (whole.start_entry_id, whole.log_start_offset, whole.archive) == (6, 0, None)


@dataclass
class Node:
    """A datanode of the failover test: its client, loop and every attempt it made."""

    node_id: int
    region_id: int
    topic: str
    client: DatanodeClient
    loop: HeartbeatLoop | None = None
    log: list[tuple[float, float, str | None, HeartbeatResponse | None]] = field(
        default_factory=list
    )
    """(start, end, address that answered or None, answer or None) of each attempt."""

    def report(self) -> HeartbeatBody:
        return body(self.node_id, self.region_id, self.topic, flushed=len(self.log))

    def send(self, heartbeat: Any) -> HeartbeatResponse:
        started = time.monotonic()
        try:
            answer = self.client.heartbeat(heartbeat)
        except Exception:
            self.log.append((started, time.monotonic(), None, None))
            raise
        self.log.append((started, time.monotonic(), self.client.current, answer))
        return answer

    def answered_by(self, url: str) -> list[tuple[float, HeartbeatResponse]]:
        return [(t, a) for t, _, u, a in self.log if u == url and a is not None]


@pytest.mark.timeout(120)
def test_after_a_leader_sigkill_datanodes_reach_the_survivor_with_spread_retries(
    cluster: Cluster,
) -> None:
    count, interval = 50, 1.0
    region_ids = [(6 << 32) | n for n in range(count)]
    (topic,) = {register(cluster, rid, node_id=n) for n, rid in enumerate(region_ids)}
    leader, survivor = cluster.leader.url, cluster.follower.url
    nodes = [
        Node(n, rid, topic, DatanodeClient(cluster.addrs, token=DATANODE, timeout=2.0))
        for n, rid in enumerate(region_ids)
    ]
    for n, node in enumerate(nodes):
        # Started together: in phase, as datanodes are after a shared event.
        node.loop = HeartbeatLoop(
            node.send, node.report, interval=interval, rng=random.Random(n), first_after=0.0
        )
    try:
        for node in nodes:
            assert node.loop is not None
            node.loop.start()
        wait_until(
            lambda: all(len(n.answered_by(leader)) >= 2 for n in nodes),
            "every datanode heartbeating to the leader",
            timeout=20,
            interval=0.1,
        )

        assert cluster.leader.proc is not None
        os.kill(cluster.leader.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        cluster.leader.proc.wait(10)

        wait_until(
            lambda: all(n.answered_by(survivor) for n in nodes),
            "every datanode answered by the survivor",
            timeout=LEASE_SECS + 15,
            interval=0.1,
        )
    finally:
        for node in nodes:
            if node.loop is not None:
                node.loop.stop(timeout=10)
            node.client.close()

    assert all(n.answered_by(survivor) for n in nodes), "some datanodes never reached it"
    reached = [n.answered_by(survivor)[0][0] - killed for n in nodes]
    # Every datanode reached the new leader within the lease + a few seconds ...
    assert max(reached) <= LEASE_SECS + 5, sorted(reached)
    # ... which knew every region (its map loaded): nothing rejected after the takeover.
    assert all(a.rejected == [] for n in nodes for _, a in n.answered_by(survivor))

    # Each datanode's first failed attempt and the retry after it: the wait between them is
    # its backoff, U(0, 0.1 s) with full jitter (each node's RNG is seeded: at least its draw).
    failed, retried, waits = [], [], []
    for n, node in enumerate(nodes):
        index = next(i for i, (_, _, url, _) in enumerate(node.log) if url is None)
        failed.append(node.log[index][1])
        retried.append(node.log[index + 1][0])
        waits.append(retried[-1] - failed[-1])
        drawn = random.Random(n).random() * 0.1
        assert waits[-1] >= drawn - 0.005, (n, waits[-1], drawn)
    print(
        f"{count} datanodes: survivor reached {min(reached):.2f}-{max(reached):.2f} s after "
        f"SIGKILL (lease {LEASE_SECS} s); first failures within "
        f"{(max(failed) - min(failed)) * 1000:.0f} ms, first retries within "
        f"{(max(retried) - min(retried)) * 1000:.0f} ms; wait before the first retry: "
        f"min {min(waits) * 1000:.0f}, mean {statistics.fmean(waits) * 1000:.0f}, max "
        f"{max(waits) * 1000:.0f}, stdev {statistics.pstdev(waits) * 1000:.0f} ms"
    )
    # Spread over the whole window, not one wave after a fixed delay.
    assert statistics.pstdev(waits) > 0.015, sorted(waits)
    assert min(waits) < 0.03 and max(waits) > 0.07, sorted(waits)


class Database:
    """The smallest database: one region that flushes when asked."""

    def __init__(self, region_id: int, topic: str) -> None:
        self.region_id, self.topic = region_id, topic
        self.flushed, self.memtable = -1, 50_000
        self.asked: list[tuple[float, tuple[int, ...]]] = []
        self.reported: list[float] = []
        self.loop: HeartbeatLoop | None = None

    def report(self) -> HeartbeatBody:
        self.reported.append(time.monotonic())
        region = RegionReport(self.region_id, self.topic, self.flushed, self.memtable)
        # 100 entries of ~1,000 bytes written: ~100 KB to replay, over the 4 KB trigger.
        topic = TopicReport(self.topic, latest_entry_id=99, record_size=100_000, record_num=100)
        return HeartbeatBody(node_id=3, regions=[region], topics=[topic])

    def on_flush(self, region_ids: tuple[int, ...]) -> None:
        self.asked.append((time.monotonic(), region_ids))
        if self.region_id in region_ids:
            self.flushed, self.memtable = 99, 0
        assert self.loop is not None
        self.loop.wake()  # report the flush now, not one interval later


def test_a_flush_instruction_reaches_the_callback_and_the_flush_is_reported(
    shared: Cluster, kafka_bootstrap: str
) -> None:
    region = (7 << 32) | 1
    # A topic of its own: the purge must not wait on the other tests' regions.
    topic = register(shared, region, topic=f"{shared.prefix}_flush", node_id=3)
    # The 100 entries the region reports: a report of entries the topic does not hold
    # would be a topic reset (DESIGN §2 invariant 8).
    produce(kafka_bootstrap, topic, 100)
    db = Database(region, topic)
    interval = 3.0
    with (
        DatanodeClient(shared.addrs[::-1], token=DATANODE) as client,
        MetasrvClient(shared.leader.url, token=OPERATOR) as operator,
    ):
        db.loop = HeartbeatLoop(
            client.heartbeat, db.report, interval=interval, on_flush=db.on_flush, first_after=0.0
        )
        db.loop.start()
        try:
            loop = db.loop
            wait_until(lambda: loop.sent >= 1, "a heartbeat sent", timeout=10)
            (info,) = operator.wait(operator.purge([topic]), timeout=60, poll_interval=0.1)
            stat = operator.region(region).stat
        finally:
            db.loop.stop()
    # Handed over once, though every answer repeats it until the region reports the flush.
    assert [ids for _, ids in db.asked] == [(region,)]
    # The flush reached metasrv: the region's stat, and the purge saw it flushed.
    assert stat is not None and stat.flushed_entry_id == 99
    assert info.data["flushed_regions"] == [region], info
    assert len(info.data["flush_instructions"]) == 1
    # wake(): the flush was reported at once, not one interval later ...
    (asked_at, _) = db.asked[0]
    next_report = min(t for t in db.reported if t > asked_at)
    assert next_report - asked_at < 0.5, next_report - asked_at
    # ... so the purge waited at most for the heartbeat that carried the instruction.
    assert info.timings["flush"] < interval + 1.5, info.timings
