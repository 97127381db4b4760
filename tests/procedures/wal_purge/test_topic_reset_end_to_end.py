"""A topic reset end to end (DESIGN §2 invariant 8) on a running `metasrv start` daemon, real
Kafka and etcd, driven over HTTP as datanodes and an operator would.

(a) A pool topic is deleted and recreated under a running leader: the purge fails with
`topic_reset` and deletes nothing, the plan shows the topic blocked by `topic_reset`,
replay-start answers 409; the operator resolves it, the region reports again, and the
topic purges normally.
(b) The same while metasrv is down: recreated, the new leader does not mask it (the purge
finds the new topic id and fails); only deleted, the new leader does not recreate it and
reports it (event, latched marker, replay-start 409).

On ef11397 (a) answered "pruned to 29: 29 entries deleted" and (b) recreated the topic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import migrations
from metasrv import keys
from metasrv.errors import Conflict
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.model import PartitionOffsets
from metasrv.wire import MetasrvClient
from tests._wait import wait_until
from tests.api._live import produce
from tests.api.conftest import heartbeat, region
from tests.metasrv.kafka._recreate import create_topic, delete_topic, recreate_topic
from toolbox.simulator import MetasrvProcess, free_port

REGION = (1024 << 32) | 1


@dataclass
class World:
    """One daemon's configuration, its kv and Kafka, and the pool topic under test."""

    config: Path
    url: str
    topic: str
    kv: EtcdKv
    kafka: KafkaAdmin
    log: Path

    def offsets(self) -> PartitionOffsets:
        return self.kafka.offsets([self.topic])[self.topic]

    def marker(self) -> keys.Marker | None:
        stored = self.kv.get(keys.topic_name(self.topic))
        return None if stored is None else keys.decode_marker(stored.value)


@pytest.fixture
def w(
    tmp_path: Path, unique_prefix: str, etcd_endpoint: str, kafka_bootstrap: str
) -> Iterator[World]:
    port = free_port()
    history = f"sqlite:///{tmp_path}/history.db"
    migrations.upgrade(history)
    config = tmp_path / "metasrv.toml"
    config.write_text(
        f"""
[wal]
broker_endpoints = ["{kafka_bootstrap}"]
num_topics = 1
topic_name_prefix = "{unique_prefix}_wal"
auto_prune_interval = "0s"
checkpoint_interval = "200ms"
region_stat_ttl = "10m"
[procedure]
max_retry_times = 2
retry_delay = "100ms"
[http]
addr = "127.0.0.1:{port}"
[kv]
backend = "etcd"
etcd_endpoints = ["{etcd_endpoint}"]
key_prefix = "{unique_prefix}/"
[history]
url = "{history}"
[election]
lease_secs = 2
"""
    )
    kv = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
    kafka = KafkaAdmin(kafka_bootstrap)
    try:
        yield World(
            config,
            f"http://127.0.0.1:{port}",
            f"{unique_prefix}_wal_0",
            kv,
            kafka,
            tmp_path / "metasrv.log",
        )
    finally:
        kv.delete_prefix("")
        kv.close()
        kafka.delete_topics(t for t in kafka.list_topics() if t.startswith(unique_prefix))


@contextlib.contextmanager
def daemon(w: World) -> Iterator[MetasrvClient]:
    """`metasrv start` until the block ends (SIGTERM); yields a client once it serves."""
    proc = MetasrvProcess(w.config, w.log, w.url, new_session=False)
    try:
        proc.start(60)
        with MetasrvClient(w.url, timeout=10.0) as client:
            yield client
    finally:
        proc.stop(30)


def _report(client: MetasrvClient, topic: str, flushed: int) -> None:
    answer = client.heartbeat(heartbeat(1, [region(REGION, topic, flushed)]))
    assert answer.rejected == [], answer


def _purge(client: MetasrvClient, topic: str) -> Any:
    (done,) = client.wait(client.purge([topic]), timeout=60, poll_interval=0.1)
    return done


def _plan(w: World) -> dict[str, Any]:
    answer = httpx.get(f"{w.url}/v1/purge/plan", params={"topic": w.topic}, timeout=10)
    assert answer.status_code == 200, answer.text
    plan: dict[str, Any] = answer.json()["topics"][0]
    return plan


def _replay_start(w: World) -> httpx.Response:
    return httpx.get(f"{w.url}/v1/regions/{REGION}/replay-start", timeout=10)


def _purged_to_60(w: World, client: MetasrvClient) -> None:
    """A region on the pool topic, 100 entries, flushed to 60, purged."""
    client.add_region(REGION, 1, w.topic)
    produce(w.kafka.bootstrap, w.topic, 100)
    _report(client, w.topic, 60)
    done = _purge(client, w.topic)
    assert done.state == "succeeded", done
    assert w.offsets().log_start_offset == 60
    stored = w.kv.get(keys.topic_name(w.topic))
    assert stored is not None and keys.decode_marker(stored.value).pruned_entry_id == 60


def _blocked_by_reset(w: World) -> None:
    """The plan, the purge's data and replay-start all show the reset; nothing deleted."""
    plan = _plan(w)
    assert plan["prune_point"] is None and plan["topic_reset"], plan
    assert plan["blocked_by"] == [{"region_id": REGION, "reason": "topic_reset"}], plan
    answer = _replay_start(w)
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "topic_reset"
    assert answer.json()["error"]["topic"] == w.topic


@pytest.mark.timeout(240)
def test_a_topic_recreated_under_a_running_leader_is_reported_then_resolved(w: World) -> None:
    with daemon(w) as client:
        _purged_to_60(w, client)
        old_id, new_id = recreate_topic(w.kafka, w.topic)
        # The region writes 30 entries (offsets 0-29 of the new topic) and reports what it
        # believes: flushed up to 60.
        produce(w.kafka.bootstrap, w.topic, 30)
        _report(client, w.topic, 60)

        done = _purge(client, w.topic)

        assert done.state == "failed" and done.error_code == "topic_reset", done
        offsets = w.offsets()
        assert (offsets.log_start_offset, offsets.high_watermark) == (0, 30)
        _blocked_by_reset(w)
        marker = w.marker()
        assert marker is not None and marker.reset is not None and marker.pruned_entry_id == 60
        assert [e.kind for e in client.events(w.topic, "topic_reset")] == ["topic_reset"]
        assert old_id is not None and new_id is not None and new_id != old_id
        assert marker.topic_id == old_id

        # The operator resolves it once the region's datanode rebuilt it from its storage.
        with pytest.raises(Conflict, match="not Kafka's id"):
            client.resolve_reset(w.topic, old_id)
        resolved = client.resolve_reset(w.topic, new_id)
        assert resolved.regions == 1 and resolved.previous_pruned_entry_id == 60
        assert w.marker() == keys.Marker(None, new_id, None)
        plan = _plan(w)
        assert plan["topic_reset"] is None
        assert plan["blocked_by"] == [{"region_id": REGION, "reason": "no_stat"}], plan
        # Reported again, at the new topic's offsets: accepted, and the topic purges.
        _report(client, w.topic, 20)
        assert client.replay_start(REGION) == 21
        done = _purge(client, w.topic)
        assert done.state == "succeeded", done
        assert w.offsets().log_start_offset == 20
        assert w.marker() == keys.Marker(20, new_id, None)
        assert [e.kind for e in client.events(w.topic, "topic_reset_resolved")] == [
            "topic_reset_resolved"
        ]


@pytest.mark.timeout(240)
def test_a_topic_recreated_while_metasrv_is_down_is_not_masked(w: World) -> None:
    with daemon(w) as client:
        _purged_to_60(w, client)
    old_id, new_id = recreate_topic(w.kafka, w.topic)
    produce(w.kafka.bootstrap, w.topic, 30)

    with daemon(w) as client:
        # A new term: the region reports what it believes to a leader with no stats.
        _report(client, w.topic, 60)
        done = _purge(client, w.topic)

        assert done.state == "failed" and done.error_code == "topic_reset", done
        offsets = w.offsets()
        assert (offsets.log_start_offset, offsets.high_watermark) == (0, 30)
        _blocked_by_reset(w)
        marker = w.marker()
        assert marker is not None and marker.reset is not None
        assert marker.topic_id == old_id is not None and offsets.topic_id == new_id


@pytest.mark.timeout(240)
def test_a_topic_deleted_while_metasrv_is_down_is_not_recreated(w: World) -> None:
    with daemon(w) as client:
        _purged_to_60(w, client)
    delete_topic(w.kafka, w.topic)

    with daemon(w) as client:
        wait_until(lambda: bool(client.events(w.topic, "topic_reset")), "the topic reset reported")
        assert w.topic not in w.kafka.list_topics()
        marker = w.marker()
        assert marker is not None and marker.pruned_entry_id == 60
        assert marker.reset is not None and marker.reset.reason == "topic_missing"
        answer = _replay_start(w)
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "topic_reset"

    # A second term reports it again and still creates nothing; the operator creates the
    # topic and resolves the reset.
    with daemon(w) as client:
        wait_until(lambda: len(client.events(w.topic, "topic_reset")) == 2, "reported again")
        assert w.topic not in w.kafka.list_topics()
        new_id = create_topic(w.kafka, w.topic)
        assert new_id is not None
        client.resolve_reset(w.topic, new_id)
        _report(client, w.topic, -1)
        assert client.replay_start(REGION) == 0
