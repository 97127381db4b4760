"""Health, readiness, leader, metrics and the error shape of unknown routes."""

from __future__ import annotations

import httpx

from tests.api.conftest import (
    Server,
    SettingsFactory,
    assert_error,
    heartbeat,
    region,
    start_server,
)


def test_health_ready_leader(server: Server, client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {
        "status": "ready",
        "checks": {"kv": "ok", "kafka": "ok", "history": "ok", "background_tasks": "ok"},
        "is_leader": True,
    }
    leader = client.get("/v1/leader").json()
    assert leader["leader"] == server.addr and leader["is_leader"] and leader["serving"]
    assert leader["term"] != 0


def test_readyz_is_503_when_kafka_is_unreachable(make_settings: SettingsFactory) -> None:
    settings = make_settings(wal={"broker_endpoints": ["127.0.0.1:1"]})
    with start_server(settings) as srv, srv.client() as c:
        resp = c.get("/readyz")
        error = assert_error(resp, 503, "not_ready")
        assert error["checks"]["kv"] == "ok"
        assert error["checks"]["kafka"] in ("unreachable", "timed out after 5s")
        # No token is needed here: the answer names the store, not its address.
        assert "127.0.0.1" not in resp.text
        assert c.get("/healthz").status_code == 200


def test_metrics_count_heartbeats_and_refresh_topic_gauges(client: httpx.Client) -> None:
    topic = client.post("/v1/regions", json={"region_id": 1, "node_id": 1}).json()["topic"]
    client.post("/v1/heartbeat", json=heartbeat(1, [region(1, topic, 4)]))
    client.post("/v1/heartbeat", json=heartbeat(1, [region(1, topic, 5), region(77, topic, 1)]))
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    assert "metasrv_heartbeats_received_total 2.0" in text
    assert "metasrv_region_stats_received_total 2.0" in text
    assert 'metasrv_region_stats_rejected_total{reason="unknown_region"} 1.0' in text
    assert f'metasrv_wal_blocked_regions{{topic="{topic}"}} 0.0' in text
    assert f'metasrv_wal_high_watermark{{topic="{topic}"}} 0.0' in text
    assert "metasrv_is_leader 1.0" in text


def test_unknown_route_and_method_use_the_error_shape(client: httpx.Client) -> None:
    assert_error(client.get("/v1/nothing"), 404, "not_found")
    assert_error(client.put("/v1/heartbeat"), 405, "method_not_allowed")


def test_openapi_documents_the_heartbeat_body(client: httpx.Client) -> None:
    doc = client.get("/openapi.json").json()
    op = doc["paths"]["/v1/heartbeat"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert set(schema["required"]) == {"node_id", "regions"}
    region_ref = schema["properties"]["regions"]["items"]["$ref"]
    region = doc["components"]["schemas"][region_ref.rsplit("/", 1)[1]]
    assert set(region["required"]) == {"region_id", "topic", "flushed_entry_id", "memtable_bytes"}
    assert "421" in op["responses"]
    answer = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert answer.endswith("/HeartbeatResponse")


def test_every_schema_reference_resolves(client: httpx.Client) -> None:
    doc = client.get("/openapi.json").json()
    refs: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.add(node["$ref"].rsplit("/", 1)[1])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    assert {"PlanList", "Procedure", "RegisterRegion", "PurgeRequest"} <= refs
    assert refs <= set(doc["components"]["schemas"])
