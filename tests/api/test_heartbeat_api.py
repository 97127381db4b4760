"""`POST /v1/heartbeat` over real HTTP: acceptance, rejections, status codes, checkpoints."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from metasrv import keys
from metasrv.kv import EtcdKv
from metasrv.wire import encode_columns
from tests._metrics import sample
from tests._wait import wait_until
from tests.api._live import produce
from tests.api.conftest import (
    Server,
    SettingsFactory,
    assert_error,
    heartbeat,
    region,
    start_server,
)


def register(
    client: httpx.Client, region_id: int, topic: str | None = None, *, node: int = 1
) -> str:
    """Register a region on `node` (a report from another datanode is `wrong_node`)."""
    body: dict[str, object] = {"region_id": region_id, "node_id": node}
    if topic is not None:
        body["topic"] = topic
    resp = client.post("/v1/regions", json=body)
    assert resp.status_code == 201, resp.text
    registered: str = resp.json()["topic"]
    return registered


def test_heartbeat_stats_show_up_in_topics_regions_and_plan(
    server: Server, client: httpx.Client
) -> None:
    t0 = register(client, 1, node=7)
    register(client, 2, topic=t0, node=7)
    plan = client.get("/v1/purge/plan", params={"topic": t0}).json()["topics"][0]
    assert plan["prune_point"] is None
    assert {b["region_id"]: b["reason"] for b in plan["blocked_by"]} == {1: "no_stat", 2: "no_stat"}

    resp = client.post(
        "/v1/heartbeat",
        json=heartbeat(
            7,
            [region(1, t0, -1), region(2, t0, -1, latest=-1, memtable=0)],
            [{"topic": t0, "latest_entry_id": -1, "record_size": 0, "record_num": 0}],
        ),
    )
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"leader": server.addr, "instructions": [], "rejected": []}
    assert resp.headers["content-type"] == "application/json"

    topic = client.get(f"/v1/topics/{t0}").json()
    assert topic["region_count"] == 2
    assert topic["latest_entry_id"] == -1
    assert topic["blocked_by"] == []
    assert topic["prune_point"] == -1  # nothing flushed: P = -1, nothing to delete
    listed = {t["topic"]: t for t in client.get("/v1/topics").json()["topics"]}
    assert listed[t0]["region_count"] == 2
    assert len(listed) == 3  # the pool

    info = client.get("/v1/regions/1").json()
    assert info["stat"]["node_id"] == 7
    assert info["stat"]["flushed_entry_id"] == -1
    assert info["replay_start_entry_id"] == 0


def test_each_rejection_reason_over_http_and_nothing_stored(client: httpx.Client) -> None:
    t0 = register(client, 1)
    t1 = register(client, 2)
    assert t0 != t1
    ok = client.post("/v1/heartbeat", json=heartbeat(1, [region(2, t1, 50, manifest=4)]))
    assert ok.json()["rejected"] == []
    resp = client.post(
        "/v1/heartbeat",
        json=heartbeat(
            1,
            [
                region(1, t1, 10),  # mapped to t0
                region(999, t0, 10),
                region(2, t1, 40, manifest=4),
                region(-3, t0, 1),
            ],
        ),
    )
    assert resp.status_code == 200
    assert {r["region_id"]: r["reason"] for r in resp.json()["rejected"]} == {
        1: "topic_mismatch",
        999: "unknown_region",
        2: "stat_regressed",
        -3: "negative_id",
    }
    assert client.get("/v1/regions/1").json()["stat"] is None
    assert client.get("/v1/regions/2").json()["stat"]["flushed_entry_id"] == 50
    assert_error(client.get("/v1/regions/999"), 404, "not_found")
    metrics = client.get("/metrics").text
    assert 'metasrv_region_stats_rejected_total{reason="topic_mismatch"} 1.0' in metrics


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"node_id": "1", "regions": []}',
        b'{"node_id": 1, "regions": [{"region_id": 1}]}',
        b'{"node_id": 1, "regions": [], "topics": [{"topic": 5}]}',
    ],
)
def test_malformed_heartbeat_is_422_and_stores_nothing(client: httpx.Client, body: bytes) -> None:
    t0 = register(client, 1)
    good = orjson.dumps(region(1, t0, 5))
    if body.startswith(b'{"node_id": 1, "regions": ['):
        # A valid region ahead of the bad part must not be stored either.
        body = body.replace(b'"regions": [', b'"regions": [' + good + b", ", 1)
        body = body.replace(b", ]", b"]")
    resp = client.post("/v1/heartbeat", content=body)
    error = assert_error(resp, 422)
    assert error["code"] in ("invalid_argument", "validation_error")
    assert client.get("/v1/regions/1").json()["stat"] is None


def test_body_over_limit_is_413_by_length_and_when_chunked(
    make_settings: SettingsFactory,
) -> None:
    with start_server(make_settings(http={"body_limit": "4KB"})) as srv, srv.client() as c:
        big = orjson.dumps(heartbeat(1, [region(i, "x", 1) for i in range(200)]))
        assert len(big) > 4096
        assert_error(c.post("/v1/heartbeat", content=big), 413, "payload_too_large")

        def chunks() -> Iterator[bytes]:
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        resp = c.post("/v1/heartbeat", content=chunks())  # no content-length: chunked
        assert resp.request.headers.get("transfer-encoding") == "chunked"
        assert_error(resp, 413, "payload_too_large")
        # The pydantic-parsed endpoints are limited the same way.
        assert_error(
            c.post(
                "/v1/regions",
                content=b'{"region_id": 1, "node_id": 1, "x": "' + b"a" * 5000 + b'"}',
            ),
            413,
        )
        # Under the limit still works.
        small = heartbeat(1, [])
        assert c.post("/v1/heartbeat", json=small).status_code == 200


def test_follower_answers_421_with_leader_address(make_settings: SettingsFactory) -> None:
    first = make_settings()
    with start_server(first) as leader:
        second = make_settings()
        with start_server(second, wait_serving=False) as follower, follower.client() as c:
            info = c.get("/v1/leader").json()
            assert info == {
                "leader": leader.addr,
                "is_leader": False,
                "serving": False,
                "term": info["term"],
                "node": follower.addr,
            }
            error = assert_error(c.post("/v1/heartbeat", json=heartbeat(1, [])), 421, "not_leader")
            assert error["leader"] == leader.addr
            resp = c.post("/v1/regions", json={"region_id": 1, "node_id": 1})
            assert assert_error(resp, 421)["leader"] == leader.addr
            assert_error(c.get("/v1/purge/plan"), 421)
            assert_error(c.get("/v1/regions/1/replay-start"), 421)
            # Health and readiness are answered by followers too.
            assert c.get("/healthz").status_code == 200
            assert c.get("/readyz").status_code == 200


def test_checkpoints_are_batched_into_etcd(
    server: Server, client: httpx.Client, etcd: EtcdKv
) -> None:
    t0 = register(client, 1, node=3)
    register(client, 2, topic=t0, node=3)
    key1, key2 = keys.topic_region(t0, 1), keys.topic_region(t0, 2)

    def checkpoint(key: str) -> int | None:
        stored = etcd.get(key)
        assert stored is not None
        cp = orjson.loads(stored.value)["checkpoint"]
        return None if cp is None else int(cp["entry_id"])

    body = heartbeat(3, [region(1, t0, 41), region(2, t0, 5, latest=60, memtable=0)])
    assert client.post("/v1/heartbeat", json=body).json()["rejected"] == []
    wait_until(lambda: checkpoint(key1) == 41 and checkpoint(key2) == 60, "both checkpoints")
    stored = etcd.get(key1)
    assert stored is not None
    assert orjson.loads(stored.value) == {"node_id": 3, "checkpoint": {"entry_id": 41}}
    revision = stored.mod_revision

    # The same stats again and again: no kv write at all.
    for _ in range(10):
        assert client.post("/v1/heartbeat", json=body).status_code == 200
    # Then region 2 moves on: the flush that writes it saw every report before it.
    moved = heartbeat(3, [region(1, t0, 41), region(2, t0, 5, latest=70, memtable=0)])
    assert client.post("/v1/heartbeat", json=moved).json()["rejected"] == []
    wait_until(lambda: checkpoint(key2) == 70, "region 2's new checkpoint")
    again = etcd.get(key1)
    assert again is not None and again.mod_revision == revision
    assert sample(server.runtime.metrics, "metasrv_checkpoint_keys_written_total") == 3


def test_heartbeat_fast_path_runs_inside_the_body_limit(make_settings: SettingsFactory) -> None:
    # The fast path serves POST /v1/heartbeat ahead of FastAPI's routing; it must sit inside
    # the body limit middleware or oversized heartbeats would be read whole (the 413 tests
    # above check the responses).
    from api import create_app
    from api.heartbeat_fast_path import HeartbeatFastPath
    from api.limits import BodyLimitMiddleware

    app = create_app(make_settings())
    outermost_first: list[object] = [m.cls for m in app.user_middleware]
    assert outermost_first == [BodyLimitMiddleware, HeartbeatFastPath]


def test_columns_heartbeat_over_http_and_the_untrusted_idle_claim_in_status(
    client: httpx.Client,
) -> None:
    t0 = register(client, 1, node=7)
    register(client, 2, t0, node=7)
    body = encode_columns(
        7,
        "dn7:4001",
        [(1, t0, 10, 500, 4096, 3), (2, t0, 10, 500, 0, 3), (999, t0, 4, None, 0, None)],
    )
    resp = client.post(
        "/v1/heartbeat", content=body, headers={"content-type": "application/msgpack"}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["rejected"] == [{"region_id": 999, "reason": "unknown_region"}]
    busy = client.get("/v1/regions/1").json()
    assert busy["stat"]["idle_claim_ignored"] is True
    assert busy["stat"]["topic_latest_entry_id"] == 500
    assert busy["prunable_entry_id"] == 10
    idle = client.get("/v1/regions/2").json()
    assert idle["stat"]["idle_claim_ignored"] is False and idle["prunable_entry_id"] == 500
    assert "metasrv_idle_claims_ignored_total 1.0" in client.get("/metrics").text
    # A body that is not msgpack under that content type is a 422 like any bad body.
    bad = client.post(
        "/v1/heartbeat", content=b'{"node_id": 1}', headers={"content-type": "application/msgpack"}
    )
    assert_error(bad, 422)


def test_scrapes_share_one_plan_while_planning_is_costly(
    server: Server, client: httpx.Client, kafka_bootstrap: str
) -> None:
    t0 = register(client, 1, node=7)
    produce(kafka_bootstrap, t0, 6)  # the entries the region reports (else a topic reset)
    metrics = server.runtime.metrics

    def blocked() -> float:
        client.get("/metrics").raise_for_status()
        return sample(metrics, "metasrv_wal_blocked_regions", {"topic": t0})

    assert blocked() == 1  # no stat yet
    resp = client.post("/v1/heartbeat", json=heartbeat(7, [region(1, t0, 5)]))
    assert resp.json()["rejected"] == []
    metrics.plan_gauges_cost = 60.0  # as if the last plan had taken a minute
    assert blocked() == 1  # the plan of a moment ago serves this scrape
    metrics.plan_gauges_cost = 0.0  # a cheap plan: every scrape plans
    assert blocked() == 0
