"""A real metasrv for the operator-side tests: etcd kv, Kafka, SQLite history, uvicorn.

`live_metasrv()` is the one entry point: its own kv prefix and topic prefix, the app under
uvicorn in a thread on a free loopback port (waited for until it leads and serves), the
world below seeded into it, and its etcd keys and Kafka topics removed afterwards.
`seed_world()` builds the state the operator tests read:

- topic 0: two regions, both reporting; purgeable up to the lower flushed id;
- topic 1: one region that never reports: blocked by `no_stat`;
- topic 2: a region whose needed entries another tool deleted: WAL data loss.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

import migrations
from metasrv import wire
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.model import region_id_of
from metasrv.settings import Settings, load_settings
from metasrv.wire import MetasrvClient
from tests.api.conftest import start_server
from toolbox.simulator import free_port

DATANODE_TOKEN = "test-datanode-token"
OPERATOR_TOKEN = "test-operator-token"
VIEWER_TOKEN = "test-viewer-token"
RECORDS_PER_TOPIC = 20
RECORD_BYTES = 100


@dataclass(frozen=True)
class LiveMetasrv:
    """A served, seeded metasrv."""

    url: str
    """Base URL."""
    prefix: str
    """Its Kafka topic prefix (pool topics are `{prefix}_{n}`) and kv key prefix."""
    world: World
    """What was seeded."""


@contextmanager
def live_metasrv(
    kafka_bootstrap: str,
    etcd_endpoint: str,
    workdir: Path,
    *,
    topic_prefix: str = "t",
    dashboard: dict[str, str] | None = None,
    history: dict[str, str] | None = None,
    wal: dict[str, Any] | None = None,
) -> Iterator[LiveMetasrv]:
    """Serve and seed a metasrv of its own; remove its keys and topics at the end.
    Its topics are `{topic_prefix}{8 hex}_{n}`; `dashboard` and `history` override those
    sections (the history's `url` is the test's own SQLite file), `wal` adds to `[wal]`."""
    prefix = f"{topic_prefix}{uuid.uuid4().hex[:8]}"
    settings = live_settings(
        prefix,
        kafka_bootstrap,
        etcd_endpoint,
        workdir,
        dashboard=dashboard,
        history=history,
        wal=wal,
    )
    try:
        with serve(settings) as url:
            yield LiveMetasrv(url, prefix, seed_world(url, prefix, kafka_bootstrap))
    finally:
        kv = EtcdKv(etcd_endpoint, settings.kv.key_prefix)
        try:
            kv.delete_prefix("")
        finally:
            kv.close()
        admin = KafkaAdmin(kafka_bootstrap)
        try:
            admin.delete_topics(t for t in admin.list_topics() if t.startswith(prefix))
        finally:
            admin.close()


def live_settings(
    prefix: str,
    kafka_bootstrap: str,
    etcd_endpoint: str,
    workdir: Path,
    *,
    num_topics: int = 3,
    dashboard: dict[str, str] | None = None,
    history: dict[str, str] | None = None,
    wal: dict[str, Any] | None = None,
) -> Settings:
    """Settings for one isolated metasrv: its own kv prefix, topic prefix and history file."""
    history_url = f"sqlite:///{workdir / f'{prefix}-history.db'}"
    migrations.upgrade(history_url)
    return load_settings(
        None,
        wal={
            "broker_endpoints": [kafka_bootstrap],
            "num_topics": num_topics,
            "topic_name_prefix": prefix,
            "auto_prune_interval": "0s",
            "region_stat_ttl": "10m",
            "flush_wait_timeout": "2s",
            **(wal or {}),
        },
        procedure={"max_retry_times": 1, "retry_delay": "100ms"},
        http={"addr": f"127.0.0.1:{free_port()}"},
        kv={"backend": "etcd", "etcd_endpoints": [etcd_endpoint], "key_prefix": f"/{prefix}/"},
        history={**(history or {}), "url": history_url},
        auth={
            "datanode_tokens": [DATANODE_TOKEN],
            "operator_tokens": [OPERATOR_TOKEN],
            "viewer_tokens": [VIEWER_TOKEN],
        },
        election={"lease_secs": 2, "node_name": ""},
        dashboard=dashboard or {},
    )


@contextmanager
def serve(settings: Settings, *, ready_timeout: float = 60.0) -> Iterator[str]:
    """Serve the app until the block ends; yields its base URL once it leads and serves."""
    with start_server(settings, token=VIEWER_TOKEN, timeout=ready_timeout, loop="auto") as server:
        yield server.base_url


def produce(bootstrap: str, topic: str, count: int = RECORDS_PER_TOPIC) -> None:
    """Write `count` WAL-like records to partition 0 of `topic`."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(count):
        producer.produce(topic, value=bytes(RECORD_BYTES - 1) + bytes([i % 256]), partition=0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records not delivered to {topic}"


@dataclass(frozen=True)
class World:
    """What `seed_world` registered."""

    purgeable_topic: str
    """Both regions report; purgeable up to `prune_point`."""
    prune_point: int
    """min(flushed) over the purgeable topic's regions."""
    purgeable_regions: tuple[int, int]
    """Regions on the purgeable topic."""
    blocked_topic: str
    """Its region never reported."""
    blocked_region: int
    """The silent region."""
    loss_topic: str
    """Kafka deleted entries its region needs."""
    loss_region: int
    """The region that lost entries."""


def seed_world(url: str, prefix: str, kafka_bootstrap: str) -> World:
    """Register regions, write records, heartbeat, and cut one topic behind metasrv's back."""
    t0, t1, t2 = (f"{prefix}_{n}" for n in range(3))
    r1, r2 = region_id_of(1024, 1), region_id_of(1024, 2)
    r3, r4 = region_id_of(1025, 1), region_id_of(1026, 1)
    with (
        MetasrvClient(url, token=OPERATOR_TOKEN) as operator,
        MetasrvClient(url, token=DATANODE_TOKEN) as datanode,
    ):
        for region, node, topic in ((r1, 1, t0), (r2, 1, t0), (r3, 2, t1), (r4, 1, t2)):
            operator.add_region(region, node, topic)
        for topic in (t0, t1, t2):
            produce(kafka_bootstrap, topic)
        last = RECORDS_PER_TOPIC - 1
        response = datanode.heartbeat(
            {
                "node_id": 1,
                "addr": "127.0.0.1:1",
                "regions": [
                    _report(r1, t0, 9),
                    _report(r2, t0, 14),
                    _report(r4, t2, 4),
                ],
                "topics": [
                    {
                        "topic": t,
                        "latest_entry_id": last,
                        "record_size": RECORDS_PER_TOPIC * RECORD_BYTES,
                        "record_num": RECORDS_PER_TOPIC,
                    }
                    for t in (t0, t2)
                ],
            }
        )
        assert response.rejected == [], response
        # A region nobody registered: rejected, so the rejection counter has a sample.
        stray = datanode.heartbeat(
            {"node_id": 1, "addr": None, "regions": [_report(region_id_of(9, 9), t0, 1)]}
        )
        assert [r.region_id for r in stray.rejected] == [region_id_of(9, 9)], stray
    # Retention (or another tool) deletes entries region r4 still needs (it flushed to 4).
    admin = KafkaAdmin(kafka_bootstrap)
    try:
        admin.delete_records({t2: 10})
    finally:
        admin.close()
    return World(
        purgeable_topic=t0,
        prune_point=9,
        purgeable_regions=(r1, r2),
        blocked_topic=t1,
        blocked_region=r3,
        loss_topic=t2,
        loss_region=r4,
    )


def _report(region_id: int, topic: str, flushed: int) -> dict[str, object]:
    return {
        "region_id": region_id,
        "topic": topic,
        "flushed_entry_id": flushed,
        "topic_latest_entry_id": None,
        "memtable_bytes": 1024,
        "manifest_version": 1,
    }


def purge_and_wait(url: str, topics: list[str], timeout: float = 60.0) -> list[wire.Procedure]:
    """Submit purges over the REST API and wait until every one is terminal."""
    with MetasrvClient(url, token=OPERATOR_TOKEN) as operator:
        ids = operator.purge(topics)
        return operator.wait(ids, timeout=timeout, poll_interval=0.2)
