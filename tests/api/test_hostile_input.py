"""Hostile input (issue #15), replayed against a real metasrv on real etcd and Kafka.

Each test is one reproducer of the issue, scaled to run in seconds: it asserts the 4xx,
that nothing changed, and, where a leader is involved, that it still leads the same term
afterwards. Raw sockets stand in for the abusive client, so nothing between the test and
the server (an HTTP client's own limits) hides what the server does.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

import migrations
from metasrv.errors import InvalidArgument
from metasrv.kafka import KafkaAdmin
from tests._wait import wait_until
from tests.api.conftest import (
    Server,
    SettingsFactory,
    assert_error,
    heartbeat,
    region,
    start_server,
)

MB = 1 << 20


@pytest.fixture
def server(make_settings: SettingsFactory) -> Iterator[Server]:
    """A serving leader, no tokens, with its history database migrated (procedure lists)."""
    settings = make_settings()
    migrations.upgrade(settings.history.url)
    with start_server(settings) as srv:
        yield srv


def _rss_bytes() -> int:
    """Resident set size of this process (the server runs in a thread of it)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _connect(server: Server, timeout: float = 10.0) -> socket.socket:
    host, _, port = server.addr.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (ConnectionResetError, TimeoutError):
        pass
    return b"".join(chunks)


def stream_request(server: Server, prefix: bytes, filler: int, suffix: bytes = b"") -> Any:
    """Send `prefix`, then up to `filler` bytes of `A`, then `suffix`, stopping as soon as
    the server answers or stops reading; return (status, body, bytes sent, seconds)."""
    chunk = b"A" * (256 * 1024)
    started = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(prefix)
        sent = len(prefix)
        left = filler
        try:
            while left > 0:
                if select.select([sock], [], [], 0)[0]:
                    break  # answered early
                n = sock.send(chunk[: min(len(chunk), left)])
                left -= n
                sent += n
            if left == 0:
                sock.sendall(suffix)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
        raw = _read_all(sock)
    elapsed = time.monotonic() - started
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else None
    return status, body, sent, elapsed


def _leader_state(client: httpx.Client) -> tuple[bool, int]:
    leader = client.get("/v1/leader").json()
    return leader["is_leader"] and leader["serving"], leader["term"]


@pytest.fixture
def topic(client: httpx.Client) -> Iterator[str]:
    """A pool topic with region 1 registered and reporting."""
    name: str = client.post("/v1/regions", json={"region_id": 1, "node_id": 1}).json()["topic"]
    assert client.post("/v1/heartbeat", json=heartbeat(1, [region(1, name, 4)])).status_code == 200
    yield name


# --- 1. a huge header costs nothing ------------------------------------------------------


@pytest.mark.parametrize("size_mb", [1, 16, 192])
def test_huge_header_gets_431_fast_and_the_leader_keeps_leading(
    server: Server, client: httpx.Client, topic: str, size_mb: int
) -> None:
    before = _leader_state(client)
    rss_before = _rss_bytes()
    status, body, sent, elapsed = stream_request(
        server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ", size_mb * MB, b"\r\n\r\n"
    )
    assert status == 431, body
    assert orjson.loads(body)["error"]["code"] == "request_header_fields_too_large"
    assert elapsed < 3.0, f"{size_mb} MB header answered after {elapsed:.1f}s"
    # The server stopped reading long before the end (its 64 KB budget plus socket buffers
    # and the few MB it drains after answering).
    assert sent < 16 * MB or size_mb == 1
    assert _rss_bytes() - rss_before < 64 * MB
    assert _leader_state(client) == before
    assert client.get(f"/v1/regions/{1}").json()["stat"]["flushed_entry_id"] == 4


def test_many_small_headers_get_431(client: httpx.Client, server: Server) -> None:
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(101))
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
    status, body, _, _ = stream_request(server, request, 0)
    assert status == 431, body
    assert b"more than 100 header fields" in body
    # At the limit, the same request is served.
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(90))
    status, body, _, _ = stream_request(
        server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n", 0
    )
    assert status == 200, body


def test_long_url_gets_414(server: Server, client: httpx.Client) -> None:
    resp = client.get("/v1/regions", params={"topic": "a" * 9000})
    assert_error(resp, 414, "uri_too_long")
    # A URL far over the head limit never reaches the parser: 431.
    status, _, _, elapsed = stream_request(
        server, b"GET /healthz?x=", 32 * MB, b" HTTP/1.1\r\n\r\n"
    )
    assert status == 431
    assert elapsed < 3.0


def test_body_limit_still_413(client: httpx.Client) -> None:
    # The test server's body limit is 1 MB.
    resp = client.post(
        "/v1/heartbeat",
        content=b"[" + b"0," * MB + b"0]",
        headers={"content-type": "application/json"},
    )
    assert_error(resp, 413, "payload_too_large")


# --- slow clients --------------------------------------------------------------------------


@pytest.fixture
def quick_timeout_server(make_settings: SettingsFactory) -> Iterator[Server]:
    with start_server(make_settings(http={"read_timeout": "1s", "body_limit": "1MB"})) as srv:
        yield srv


@pytest.mark.parametrize(
    "partial",
    [
        b"",  # connects and says nothing
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n",  # a head that never ends
        b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",  # body
    ],
    ids=["idle", "slow-head", "slow-body"],
)
def test_slow_client_gets_408_and_is_closed(quick_timeout_server: Server, partial: bytes) -> None:
    started = time.monotonic()
    with _connect(quick_timeout_server) as sock:
        sock.sendall(partial)
        raw = _read_all(sock)
    elapsed = time.monotonic() - started
    assert raw.startswith(b"HTTP/1.1 408 "), raw
    assert b'"request_timeout"' in raw
    assert 0.9 < elapsed < 5.0
    with quick_timeout_server.client() as client:
        assert client.get("/healthz").status_code == 200


def test_a_slow_but_steady_request_within_the_timeout_is_served(
    quick_timeout_server: Server,
) -> None:
    with _connect(quick_timeout_server) as sock:
        for part in (b"GET /healthz HTTP/1.1\r\n", b"Host: x\r\n", b"Connection: close\r\n\r\n"):
            sock.sendall(part)
            time.sleep(0.2)  # the behaviour under test: a slow client, within the timeout
        raw = _read_all(sock)
    assert raw.startswith(b"HTTP/1.1 200 "), raw


# --- 6. topic names Kafka refuses are the caller's error, never "retry later" -------------


@pytest.mark.parametrize("name", [".", "..", "t" * 250, "a b", ""])
def test_topic_names_kafka_refuses_get_422(client: httpx.Client, name: str) -> None:
    resp = client.post("/v1/regions", json={"region_id": 5, "node_id": 1, "topic": name})
    error = assert_error(resp, 422, "validation_error")
    assert "Retry-After" not in resp.headers
    assert "topic" in error["message"]
    assert_error(client.get("/v1/regions/5"), 404)


def test_topic_name_colliding_with_an_existing_topic_gets_409(
    client: httpx.Client, unique_prefix: str, kafka_admin: KafkaAdmin
) -> None:
    underscore, dotted = f"{unique_prefix}_c_d", f"{unique_prefix}_c.d"
    resp = client.post("/v1/regions", json={"region_id": 10, "node_id": 1, "topic": underscore})
    assert resp.status_code == 201, resp.text
    resp = client.post("/v1/regions", json={"region_id": 11, "node_id": 1, "topic": dotted})
    error = assert_error(resp, 409, "conflict")
    assert "Retry-After" not in resp.headers
    assert underscore in error["message"] and "collides" in error["message"]
    assert_error(client.get("/v1/regions/11"), 404)
    assert dotted not in kafka_admin.list_topics()


def test_kafka_refusing_a_topic_name_is_invalid_argument(kafka_admin: KafkaAdmin) -> None:
    # The adapter's translation, for a name that reaches Kafka by another way than the API.
    with pytest.raises(InvalidArgument, match=r"'\.\.' is not allowed"):
        kafka_admin.ensure_topics([".."])


# --- 7. dry_run is a JSON boolean, nothing else --------------------------------------------


@pytest.mark.parametrize("value", [0, 1, "yes", "true", None, 0.0])
def test_dry_run_takes_only_json_booleans(client: httpx.Client, topic: str, value: Any) -> None:
    resp = client.post("/v1/purge", json={"topics": [topic], "dry_run": value})
    error = assert_error(resp, 422, "validation_error")
    assert "dry_run" in error["message"]
    # Nothing was submitted (`0` used to be read as false: a real purge).
    listed = client.get("/v1/procedures")
    assert listed.status_code == 200, listed.text
    assert listed.json()["procedures"] == []
    assert client.post("/v1/purge", json={"topics": [topic], "dry_run": True}).status_code == 200


# --- 2. a background task that fails keeps running, counted; a dead one is not ready -----


def _errors_of(client: httpx.Client, task: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'metasrv_background_task_errors_total{{task="{task}"}} '):
            return float(line.split()[-1])
    return 0.0


def test_a_failing_stat_history_writer_is_counted_and_keeps_running(
    make_settings: SettingsFactory, tmp_path: Any
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("the history directory cannot be created here")
    settings = make_settings(
        history={"stats_url": str(blocker)}, reconcile={"stat_history_interval": "100ms"}
    )
    with start_server(settings) as srv, srv.client() as client:
        # Three failed rounds in a row: the writer survived each one.
        wait_until(
            lambda: _errors_of(client, "stat_history") >= 3,
            "three failed history rounds",
            timeout=10,
            interval=0.1,
        )
        assert client.get("/readyz").json()["checks"]["background_tasks"] == "ok"
        assert _leader_state(client)[0]


def test_a_dead_background_task_makes_readyz_name_it(server: Server, client: httpx.Client) -> None:
    assert client.get("/readyz").status_code == 200
    runtime = server.runtime
    loop = runtime.loop_lag.task.get_loop()  # type: ignore[union-attr]

    async def dies() -> None:
        raise OverflowError("int too big to convert")

    def start() -> None:
        runtime.background.watch("ticker", loop.create_task(dies()))

    loop.call_soon_threadsafe(start)
    wait_until(lambda: client.get("/readyz").status_code != 200, "/readyz not ready", timeout=5)
    error = assert_error(client.get("/readyz"), 503, "not_ready")
    assert error["checks"]["background_tasks"] == "dead: ticker"
    assert "ticker" in error["message"]
    assert _errors_of(client, "ticker") == 1


# --- the dashboard: security headers, no token in URLs -------------------------------------


def test_dashboard_sends_security_headers(client: httpx.Client) -> None:
    resp = client.get("/dashboard")
    assert resp.status_code == 200
    csp = resp.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    # Only the page's own script, by hash: an injected one would not run.
    assert directives["script-src"].startswith("'sha256-")
    assert "unsafe" not in directives["script-src"]
    assert resp.headers["x-frame-options"] == "DENY"
    assert resp.headers["x-content-type-options"] == "nosniff"
    assert resp.headers["referrer-policy"] == "no-referrer"


def test_dashboard_refuses_a_token_in_the_url(client: httpx.Client) -> None:
    error = assert_error(client.get("/dashboard", params={"token": "secret"}), 400, "token_in_url")
    assert "secret" not in error["message"]
