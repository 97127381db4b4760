"""Region and topic routes over real HTTP, on real etcd and Kafka."""

from __future__ import annotations

import httpx
import pytest

from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from tests._wait import wait_until
from tests.api._live import produce
from tests.api.conftest import (
    NUM_TOPICS,
    Server,
    SettingsFactory,
    assert_error,
    heartbeat,
    region,
    start_server,
)


def test_leader_creates_the_pool_and_registration_assigns_least_loaded(
    client: httpx.Client, kafka_bootstrap: str, unique_prefix: str, etcd: EtcdKv
) -> None:
    pool = [f"{unique_prefix}_wal_{n}" for n in range(NUM_TOPICS)]
    kafka = KafkaAdmin(kafka_bootstrap)
    # wal.auto_create_topics (default true, as in GreptimeDB): the whole pool at start-up.
    wait_until(lambda: set(pool) <= kafka.list_topics(), "the leader's topic pool", interval=0.2)

    resp = client.post("/v1/regions", json={"region_id": 10, "node_id": 1})
    assert resp.status_code == 201
    assert resp.json() == {"region_id": 10, "topic": pool[0], "node_id": 1}
    assert pool[0] in kafka.list_topics()
    assert etcd.get(keys.topic_region(pool[0], 10)) is not None

    client.post("/v1/regions", json={"region_id": 11, "node_id": 1, "topic": pool[2]})
    client.post("/v1/regions", json={"region_id": 12, "node_id": 1, "topic": pool[2]})
    # Loads are now 1, 0, 2: next goes to pool[1], then pool[0] and pool[1] tie at 1.
    topics = [
        client.post("/v1/regions", json={"region_id": r, "node_id": 2}).json()["topic"]
        for r in (13, 14, 15)
    ]
    assert topics == [pool[1], pool[0], pool[1]]
    assert set(pool) <= kafka.list_topics()
    counts = {t["topic"]: t["region_count"] for t in client.get("/v1/topics").json()["topics"]}
    assert counts == {pool[0]: 2, pool[1]: 2, pool[2]: 2}


def test_registration_is_idempotent_and_conflicts_are_409(client: httpx.Client) -> None:
    first = client.post("/v1/regions", json={"region_id": 1, "node_id": 1})
    again = client.post("/v1/regions", json={"region_id": 1, "node_id": 1})
    assert again.status_code == 201 and again.json() == first.json()
    other = next(
        t["topic"]
        for t in client.get("/v1/topics").json()["topics"]
        if t["topic"] != first.json()["topic"]
    )
    resp = client.post("/v1/regions", json={"region_id": 1, "node_id": 1, "topic": other})
    assert assert_error(resp, 409, "conflict")["topic"] == first.json()["topic"]


@pytest.mark.parametrize(
    "body",
    [
        {"region_id": "1", "node_id": 1},
        {"region_id": -1, "node_id": 1},
        {"region_id": 1 << 64, "node_id": 1},
        {"region_id": 1, "node_id": -2},
        {"region_id": 1},
        {"region_id": 1, "node_id": 1, "topic": "no spaces"},
        {"region_id": 1, "node_id": 1, "extra": True},
        {"region_id": True, "node_id": 1},
    ],
)
def test_bad_registration_is_422(client: httpx.Client, body: dict[str, object]) -> None:
    error = assert_error(client.post("/v1/regions", json=body), 422, "validation_error")
    assert error["errors"]
    assert_error(client.get("/v1/regions/1"), 404)


def test_malformed_json_registration_is_422(client: httpx.Client) -> None:
    resp = client.post("/v1/regions", content=b"{", headers={"content-type": "application/json"})
    assert_error(resp, 422)


def test_deregister(client: httpx.Client, etcd: EtcdKv) -> None:
    topic = client.post("/v1/regions", json={"region_id": 5, "node_id": 1}).json()["topic"]
    client.post("/v1/heartbeat", json=heartbeat(1, [region(5, topic, 3)]))
    resp = client.delete("/v1/regions/5")
    assert resp.status_code == 204 and resp.content == b""
    assert etcd.get(keys.topic_region(topic, 5)) is None
    assert_error(client.get("/v1/regions/5"), 404, "not_found")
    assert_error(client.delete("/v1/regions/5"), 404, "not_found")
    # Heartbeats for it are now rejected.
    resp = client.post("/v1/heartbeat", json=heartbeat(1, [region(5, topic, 4)]))
    assert resp.json()["rejected"] == [{"region_id": 5, "reason": "unknown_region"}]


def test_bad_path_ids_are_422(client: httpx.Client) -> None:
    assert_error(client.get("/v1/regions/abc"), 422)
    assert_error(client.get("/v1/regions/-1/replay-start"), 422)
    assert_error(client.delete(f"/v1/regions/{1 << 64}"), 422)


def test_replay_start_uses_live_stat_then_checkpoint_then_marker(
    make_settings: SettingsFactory, etcd: EtcdKv, kafka_bootstrap: str
) -> None:
    settings = make_settings()
    with start_server(settings) as srv, srv.client() as c:
        topic = c.post("/v1/regions", json={"region_id": 8, "node_id": 1}).json()["topic"]
        assert c.get("/v1/regions/8/replay-start").json() == {
            "region_id": 8,
            "topic": topic,
            "start_entry_id": 0,
            "log_start_offset": 0,
            "archive": None,
        }
        # The entries the markers below name (a marker above Kafka's high watermark - 1
        # is a topic reset).
        produce(kafka_bootstrap, topic, 60)
        c.post("/v1/heartbeat", json=heartbeat(1, [region(8, topic, 30, latest=None)]))
        assert c.get("/v1/regions/8/replay-start").json()["start_entry_id"] == 31
        etcd.put(keys.topic_name(topic), b'{"pruned_entry_id": 50}')
        assert c.get("/v1/regions/8/replay-start").json()["start_entry_id"] == 51
        etcd.put(keys.topic_name(topic), b'{"pruned_entry_id": 10}')
        assert c.get("/v1/regions/8/replay-start").json()["start_entry_id"] == 31
        # Idle (empty memtable) at the topic's entry 40: every entry of the region is at
        # or below its flushed id 30, and whatever it writes next is above 40, so it
        # needs nothing at or below 40 (and a purge may delete up to 40).
        c.post("/v1/heartbeat", json=heartbeat(1, [region(8, topic, 30, latest=40, memtable=0)]))
        assert c.get("/v1/regions/8/replay-start").json()["start_entry_id"] == 41
        assert_error(c.get("/v1/regions/9/replay-start"), 404)
    # A new leader has no live stats: the persisted checkpoint (flushed on shutdown) counts.
    with start_server(settings) as srv, srv.client() as c:
        info = c.get("/v1/regions/8").json()
        assert info["stat"] is None and info["checkpoint_entry_id"] == 40
        assert c.get("/v1/regions/8/replay-start").json()["start_entry_id"] == 41


def test_plan_and_topic_views(
    server: Server, client: httpx.Client, unique_prefix: str, kafka_bootstrap: str
) -> None:
    t0 = client.post("/v1/regions", json={"region_id": 1, "node_id": 1}).json()["topic"]
    client.post("/v1/regions", json={"region_id": 2, "node_id": 1, "topic": t0})
    produce(kafka_bootstrap, t0, 6)
    client.post(
        "/v1/heartbeat",
        json=heartbeat(1, [region(1, t0, 5)]),
    )
    plans = {p["topic"]: p for p in client.get("/v1/purge/plan").json()["topics"]}
    assert len(plans) == NUM_TOPICS
    assert plans[t0]["blocked_by"] == [{"region_id": 2, "reason": "no_stat"}]
    assert plans[t0]["log_start_offset"] == 0 and plans[t0]["high_watermark"] == 6
    assert plans[t0]["region_count"] == 2
    empty = plans[f"{unique_prefix}_wal_1"]
    assert empty["region_count"] == 0 and empty["log_start_offset"] is None

    client.post("/v1/heartbeat", json=heartbeat(1, [region(2, t0, 3)]))
    (plan,) = client.get("/v1/purge/plan", params={"topic": t0}).json()["topics"]
    assert plan["blocked_by"] == [] and plan["prune_point"] == 3

    # A region reporting entries the topic does not have (above the high watermark - 1):
    # the topic was recreated or truncated under metasrv, a topic reset (invariant 8).
    client.post("/v1/heartbeat", json=heartbeat(1, [region(2, t0, 9)]))
    (plan,) = client.get("/v1/purge/plan", params={"topic": t0}).json()["topics"]
    assert plan["prune_point"] is None
    assert plan["blocked_by"] == [{"region_id": 2, "reason": "topic_reset"}]
    assert plan["topic_reset"].startswith("regions_ahead_of_high_watermark")
    assert plan["topic_id"]

    assert_error(client.get("/v1/purge/plan", params={"topic": "nosuchtopic"}), 404)
    assert_error(client.get("/v1/topics/nosuchtopic"), 404)
    assert_error(client.get("/v1/purge/plan", params={"topic": "bad topic"}), 422)

    regions = client.get("/v1/regions", params={"topic": t0}).json()["regions"]
    assert [r["region_id"] for r in regions] == [1, 2]
    assert client.get("/v1/regions", params={"limit": 1}).json()["regions"][0]["region_id"] == 1
