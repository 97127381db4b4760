"""Topic resets outside the purge (DESIGN §2 invariant 8), over real HTTP on real etcd and
Kafka: a new term never recreates a purged pool topic Kafka lacks (it reports and latches
the reset), replay-start and the region view answer no offset of a reset topic or from a
damaged marker, and the operator's resolve action."""

from __future__ import annotations

import httpx
import orjson

from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.keys import Marker, ResetLatch
from metasrv.kv import EtcdKv
from tests._wait import wait_until
from tests.api._live import produce
from tests.api.conftest import (
    SettingsFactory,
    assert_error,
    heartbeat,
    region,
    start_server,
)
from tests.metasrv.kafka._recreate import delete_topic, recreate_topic, topic_id


def _latch(etcd: EtcdKv, topic: str, pruned: int | None, tid: str | None = None) -> None:
    marker = Marker(pruned, tid, ResetLatch("topic_id_changed", "newid", 3))
    etcd.put(keys.topic_name(topic), keys.encode_marker(marker))


def _events(client: httpx.Client, topic: str, kind: str) -> list[dict[str, object]]:
    answer = client.get("/v1/events", params={"topic": topic, "limit": 100})
    assert answer.status_code == 200, answer.text
    return [e for e in answer.json()["events"] if e["kind"] == kind]


def test_a_new_term_does_not_recreate_a_purged_pool_topic_and_reports_it(
    make_settings: SettingsFactory, etcd: EtcdKv, kafka_bootstrap: str, unique_prefix: str
) -> None:
    settings = make_settings()
    purged, unused, kept = (f"{unique_prefix}_wal_{n}" for n in range(3))
    kafka = KafkaAdmin(kafka_bootstrap)
    with start_server(settings):
        wait_until(lambda: {purged, unused, kept} <= kafka.list_topics(), "the pool created")
    old_id = "Jy89oMt5T76posaVgBcaZQ"
    # metasrv purged `purged` (its marker) but never `unused`; both are deleted while no
    # metasrv runs (a clean-up script, an operator).
    etcd.put(keys.topic_name(purged), orjson.dumps({"pruned_entry_id": 10, "topic_id": old_id}))
    delete_topic(kafka, purged)
    delete_topic(kafka, unused)

    with start_server(settings) as srv, srv.client() as client:
        # The term creates the pool topic without a marker, after it dealt with the other.
        wait_until(lambda: unused in kafka.list_topics(), "the unmarked pool topic recreated")
        assert purged not in kafka.list_topics()
        stored = etcd.get(keys.topic_name(purged))
        assert stored is not None
        marker = keys.decode_marker(stored.value)
        assert marker.pruned_entry_id == 10 and marker.topic_id == old_id
        assert marker.reset is not None and marker.reset.reason == "topic_missing"
        (event,) = _events(client, purged, "topic_reset")
        assert "not recreated" in str(event["message"])
        assert _events(client, unused, "topic_reset") == []
        latched_at = stored.mod_revision
    # The next term reports it again and keeps the latch as it is.
    with start_server(settings) as srv, srv.client() as client:
        wait_until(
            lambda: len(_events(client, purged, "topic_reset")) == 2, "a second topic_reset event"
        )
        assert purged not in kafka.list_topics()
        again = etcd.get(keys.topic_name(purged))
        assert again is not None and again.mod_revision == latched_at


def test_replay_start_answers_no_offset_of_a_reset_topic(
    client: httpx.Client, etcd: EtcdKv, kafka_bootstrap: str
) -> None:
    topic = client.post("/v1/regions", json={"region_id": 8, "node_id": 1}).json()["topic"]
    produce(kafka_bootstrap, topic, 60)
    client.post("/v1/heartbeat", json=heartbeat(1, [region(8, topic, 30)]))
    assert client.get("/v1/regions/8/replay-start").json()["start_entry_id"] == 31

    _latch(etcd, topic, 50)
    error = assert_error(client.get("/v1/regions/8/replay-start"), 409, "topic_reset")
    assert error["topic"] == topic and error["reason"] == "topic_id_changed"
    assert "resolve-reset" in str(error["message"])
    etcd.put(keys.topic_name(topic), b'{"pruned_entry_id": 50}')
    assert client.get("/v1/regions/8/replay-start").json()["start_entry_id"] == 51


def test_replay_start_answers_no_offset_of_a_topic_recreated_before_any_purge_saw_it(
    client: httpx.Client, etcd: EtcdKv, kafka_bootstrap: str
) -> None:
    topic = client.post("/v1/regions", json={"region_id": 8, "node_id": 1}).json()["topic"]
    kafka = KafkaAdmin(kafka_bootstrap)
    produce(kafka_bootstrap, topic, 70)
    old_id = kafka.offsets([topic])[topic].topic_id
    etcd.put(keys.topic_name(topic), keys.encode_marker(Marker(60, old_id)))
    client.post("/v1/heartbeat", json=heartbeat(1, [region(8, topic, 60)]))
    assert client.get("/v1/regions/8/replay-start").json()["start_entry_id"] == 61

    recreate_topic(kafka, topic)
    produce(kafka_bootstrap, topic, 70)  # the new topic has an offset 61: not read as ours

    error = assert_error(client.get("/v1/regions/8/replay-start"), 409, "topic_reset")
    assert str(error["reason"]).startswith("topic_id_changed"), error
    # A marker written before metasrv recorded topic ids: Kafka's high watermark tells.
    etcd.put(keys.topic_name(topic), b'{"pruned_entry_id": 80}')
    error = assert_error(client.get("/v1/regions/8/replay-start"), 409, "topic_reset")
    assert str(error["reason"]).startswith("high_watermark_below_marker"), error
    stored = etcd.get(keys.topic_name(topic))
    assert stored is not None and keys.decode_marker(stored.value).reset is None  # a read


def test_replay_start_answers_no_offset_from_a_damaged_marker(
    client: httpx.Client, etcd: EtcdKv, kafka_bootstrap: str
) -> None:
    topic = client.post("/v1/regions", json={"region_id": 8, "node_id": 1}).json()["topic"]
    produce(kafka_bootstrap, topic, 60)
    client.post("/v1/heartbeat", json=heartbeat(1, [region(8, topic, 30)]))
    # ef11397 read a damaged marker as "never purged" and answered 31.
    etcd.put(keys.topic_name(topic), b'{"pruned_entry_id": "fifty"}')
    error = assert_error(client.get("/v1/regions/8/replay-start"), 500, "damaged_marker")
    assert error["topic"] == topic
    etcd.put(keys.topic_name(topic), b"not json")
    assert_error(client.get("/v1/regions/8/replay-start"), 500, "damaged_marker")

    etcd.put(keys.topic_name(topic), b'{"pruned_entry_id": 50}')
    assert client.get("/v1/regions/8/replay-start").json()["start_entry_id"] == 51


def test_region_view_shows_a_damaged_marker_as_replay_start_does(
    client: httpx.Client, etcd: EtcdKv, kafka_bootstrap: str
) -> None:
    topic = client.post("/v1/regions", json={"region_id": 8, "node_id": 1}).json()["topic"]
    produce(kafka_bootstrap, topic, 60)
    client.post("/v1/heartbeat", json=heartbeat(1, [region(8, topic, 30)]))
    # The region view read a damaged marker as "never purged" and showed a replay start of
    # 31 that replay-start itself refuses to answer.
    etcd.put(keys.topic_name(topic), b'{"pruned_entry_id": "fifty"}')
    error = assert_error(client.get("/v1/regions/8"), 500, "damaged_marker")
    assert error["topic"] == topic

    etcd.put(keys.topic_name(topic), b'{"pruned_entry_id": 50}')
    shown = client.get("/v1/regions/8").json()
    assert shown["pruned_entry_id"] == 50 and shown["replay_start_entry_id"] == 51


def test_resolve_reset_checks_its_topic_and_id(
    client: httpx.Client, etcd: EtcdKv, kafka_bootstrap: str
) -> None:
    topic = client.post("/v1/regions", json={"region_id": 9, "node_id": 1}).json()["topic"]
    current = topic_id(KafkaAdmin(kafka_bootstrap), topic)
    path = f"/v1/topics/{topic}/resolve-reset"
    assert_error(
        client.post("/v1/topics/no_such_topic/resolve-reset", json={"topic_id": current}),
        404,
        "not_found",
    )
    for bad in ({}, {"topic_id": 5}, {"topic_id": ""}, {"topic_id": current, "more": 1}):
        assert_error(client.post(path, json=bad), 422, "validation_error")
    # Nothing latched: never purged, then purged without a reset.
    assert_error(client.post(path, json={"topic_id": current}), 409, "conflict")
    etcd.put(keys.topic_name(topic), b'{"pruned_entry_id": 5}')
    assert_error(client.post(path, json={"topic_id": current}), 409, "conflict")
    # Latched, but the id is not Kafka's id of the topic now.
    _latch(etcd, topic, 5)
    error = assert_error(client.post(path, json={"topic_id": "AAAAAAAAAAAAAAAAAAAAAB"}), 409)
    assert error["topic_id"] == current
    stored = etcd.get(keys.topic_name(topic))
    assert stored is not None and keys.decode_marker(stored.value).reset is not None


def test_resolve_reset_clears_the_marker_and_every_region_reports_again(
    client: httpx.Client, etcd: EtcdKv, kafka_bootstrap: str
) -> None:
    topic = client.post("/v1/regions", json={"region_id": 11, "node_id": 1}).json()["topic"]
    client.post("/v1/regions", json={"region_id": 12, "node_id": 2, "topic": topic})
    for node, rid in ((1, 11), (2, 12)):
        sent = client.post("/v1/heartbeat", json=heartbeat(node, [region(rid, topic, 60)]))
        assert sent.json()["rejected"] == []
    # Checkpoints flushed (every 200 ms in these settings).
    wait_until(
        lambda: all(
            (kv := etcd.get(keys.topic_region(topic, rid))) is not None
            and b'"entry_id":60' in kv.value.replace(b" ", b"")
            for rid in (11, 12)
        ),
        "checkpoints written",
    )
    _latch(etcd, topic, 60, "oldid")
    # Before: the recreated topic's low offsets are a regression of the stored stats.
    low = client.post("/v1/heartbeat", json=heartbeat(1, [region(11, topic, 2)]))
    assert low.json()["rejected"] == [{"region_id": 11, "reason": "stat_regressed"}]

    current = topic_id(KafkaAdmin(kafka_bootstrap), topic)
    path = f"/v1/topics/{topic}/resolve-reset"
    done = client.post(path, json={"topic_id": current})

    assert done.status_code == 200, done.text
    assert done.json() == {
        "topic": topic,
        "topic_id": current,
        "regions": 2,
        "previous_pruned_entry_id": 60,
        "reset_reason": "topic_id_changed",
    }
    stored = etcd.get(keys.topic_name(topic))
    assert stored is not None
    assert orjson.loads(stored.value) == {
        "pruned_entry_id": None,
        "topic_id": current,
        "reset": None,
    }
    for rid in (11, 12):
        assert client.get(f"/v1/regions/{rid}").json()["stat"] is None
        route = etcd.get(keys.topic_region(topic, rid))
        assert route is not None and keys.decode_route(route.key, route.value) is not None
        decoded = keys.decode_route(route.key, route.value)
        assert decoded is not None and decoded.checkpoint_entry_id == -1
        assert client.get(f"/v1/regions/{rid}/replay-start").json()["start_entry_id"] == 0
    plan = client.get("/v1/purge/plan", params={"topic": topic}).json()["topics"][0]
    assert plan["prune_point"] is None
    assert {b["reason"] for b in plan["blocked_by"]} == {"no_stat"}
    # The regions report again at the new topic's offsets: accepted.
    low = client.post("/v1/heartbeat", json=heartbeat(1, [region(11, topic, 2)]))
    assert low.json()["rejected"] == []
    assert client.get("/v1/regions/11/replay-start").json()["start_entry_id"] == 3
    (event,) = _events(client, topic, "topic_reset_resolved")
    assert event["details"] == {
        "topic_id": current,
        "regions": 2,
        "previous_pruned_entry_id": 60,
        "previous_topic_id": "oldid",
        "reset_reason": "topic_id_changed",
    }
    # Resolved once: nothing latched any more.
    assert_error(client.post(path, json={"topic_id": current}), 409, "conflict")


def test_resolve_reset_needs_an_operator_token(make_settings: SettingsFactory) -> None:
    settings = make_settings(
        auth={"operator_tokens": ["op-secret"], "viewer_tokens": ["view-secret"]}
    )
    path, body = "/v1/topics/x/resolve-reset", {"topic_id": "abc"}
    with start_server(settings, wait_serving=False) as srv:
        with srv.client("op-secret") as operator:
            answers: list[int] = []

            def served() -> bool:
                answers.append(operator.post(path, json=body).status_code)
                return answers[-1] not in (421, 503)

            wait_until(served, "a serving leader")
            assert answers[-1] == 404  # an operator may: the topic is unknown
        with srv.client("view-secret") as viewer:
            assert_error(viewer.post(path, json=body), 403, "permission_denied")
        with srv.client() as anonymous:
            assert_error(anonymous.post(path, json=body), 401, "unauthenticated")


def test_a_registration_does_not_recreate_a_purged_topic(
    client: httpx.Client, etcd: EtcdKv, kafka_bootstrap: str, unique_prefix: str
) -> None:
    kafka = KafkaAdmin(kafka_bootstrap)
    purged, fresh = f"{unique_prefix}_gone", f"{unique_prefix}_new"
    # metasrv purged `purged` once (its marker), then the topic vanished from Kafka.
    etcd.put(keys.topic_name(purged), orjson.dumps({"pruned_entry_id": 10, "topic_id": "x"}))
    assert purged not in kafka.list_topics()

    refused = client.post("/v1/regions", json={"region_id": 91, "node_id": 1, "topic": purged})
    error = assert_error(refused, 409, "topic_reset")
    assert error["topic"] == purged and "resolve-reset" in str(error["message"])
    assert purged not in kafka.list_topics()
    assert client.get("/v1/regions/91").status_code == 404
    # A topic metasrv never purged is created on its first registration, as before.
    created = client.post("/v1/regions", json={"region_id": 92, "node_id": 1, "topic": fresh})
    assert created.status_code == 201, created.text
    assert fresh in kafka.list_topics()
