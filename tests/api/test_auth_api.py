"""Bearer tokens per role: 401, 403, operator-as-viewer, open roles, open_read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.api.conftest import Server, SettingsFactory, assert_error, heartbeat, start_server

TOKENS = {
    "datanode_tokens": ["dn-secret"],
    "operator_tokens": ["op-secret"],
    "viewer_tokens": ["view-secret"],
}


@pytest.fixture
def secured(make_settings: SettingsFactory) -> Iterator[Server]:
    with start_server(make_settings(auth=TOKENS), wait_serving=False) as srv:
        yield srv


def call(srv: Server, token: str | None, method: str, path: str, **kw: Any) -> httpx.Response:
    with srv.client(token) as c:
        return c.request(method, path, **kw)


Endpoint = tuple[str, str, dict[str, Any]]

HEARTBEAT: Endpoint = ("POST", "/v1/heartbeat", {"json": heartbeat(1, [])})
REGISTER: Endpoint = ("POST", "/v1/regions", {"json": {"region_id": 1, "node_id": 1}})
PLAN: Endpoint = ("GET", "/v1/purge/plan", {})
TOPICS: Endpoint = ("GET", "/v1/topics", {})
LEADER: Endpoint = ("GET", "/v1/leader", {})
METRICS: Endpoint = ("GET", "/metrics", {})
REPLAY: Endpoint = ("GET", "/v1/regions/1/replay-start", {})

# (endpoint, token, expected status), in order: REGISTER creates region 1, which REPLAY reads.
MATRIX = [
    (HEARTBEAT, "dn-secret", 200),
    (HEARTBEAT, "op-secret", 403),
    (HEARTBEAT, "view-secret", 403),
    (HEARTBEAT, None, 401),
    (HEARTBEAT, "wrong", 401),
    (REGISTER, "op-secret", 201),
    (REGISTER, "dn-secret", 403),
    (REGISTER, "view-secret", 403),
    (REGISTER, None, 401),
    (PLAN, "view-secret", 200),
    (PLAN, "op-secret", 200),  # operators may read
    (PLAN, "dn-secret", 403),  # datanodes only the datanode endpoints
    (PLAN, None, 401),
    (TOPICS, "view-secret", 200),
    (LEADER, "view-secret", 200),
    (LEADER, "dn-secret", 403),
    (METRICS, "view-secret", 200),
    (METRICS, None, 401),
    (REPLAY, "dn-secret", 200),
    (REPLAY, "op-secret", 200),
    (REPLAY, "view-secret", 403),
    (REPLAY, None, 401),
]


def test_role_matrix(secured: Server) -> None:
    with secured.client() as c:
        # Wait for the leader to serve (the readiness of leader endpoints, not of auth).
        for _ in range(200):
            if c.get("/v1/leader", headers={"Authorization": "Bearer view-secret"}).json()[
                "serving"
            ]:
                break
    failures = []
    for (method, path, kw), token, expected in MATRIX:
        resp = call(secured, token, method, path, **kw)
        if resp.status_code != expected:
            failures.append((method, path, token, expected, resp.status_code, resp.text))
            continue
        if expected in (401, 403):
            assert_error(
                resp, expected, "unauthenticated" if expected == 401 else "permission_denied"
            )
    assert failures == []


def test_401_names_bearer_and_malformed_header_is_401(secured: Server) -> None:
    with secured.client() as c:
        resp = c.get("/v1/topics")
        assert resp.headers["www-authenticate"] == "Bearer"
        resp = c.get("/v1/topics", headers={"Authorization": "Basic dmlldy1zZWNyZXQ="})
        assert_error(resp, 401, "unauthenticated")
        resp = c.get("/v1/topics", headers={"Authorization": "Bearer"})
        assert_error(resp, 401, "unauthenticated")


def test_health_needs_no_token(secured: Server) -> None:
    with secured.client() as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200


def test_open_read_opens_reads_only(make_settings: SettingsFactory) -> None:
    settings = make_settings(auth={**TOKENS, "open_read": True})
    with start_server(settings) as srv, srv.client() as c:
        assert c.get("/v1/topics").status_code == 200
        assert c.get("/metrics").status_code == 200
        assert_error(c.post("/v1/heartbeat", json=heartbeat(1, [])), 401)
        assert_error(c.post("/v1/regions", json={"region_id": 1, "node_id": 1}), 401)


def test_empty_token_list_leaves_that_role_open(make_settings: SettingsFactory) -> None:
    # Only operator tokens configured: datanode and viewer endpoints are open.
    settings = make_settings(auth={"operator_tokens": ["op-secret"]})
    with start_server(settings) as srv, srv.client() as c:
        assert c.post("/v1/heartbeat", json=heartbeat(1, [])).status_code == 200
        assert c.get("/v1/topics").status_code == 200
        assert_error(c.post("/v1/regions", json={"region_id": 1, "node_id": 1}), 401)
        with srv.client("op-secret") as op:
            assert op.post("/v1/regions", json={"region_id": 1, "node_id": 1}).status_code == 201
