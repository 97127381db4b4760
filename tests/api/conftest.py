"""A real metasrv (uvicorn + the FastAPI app) on a free port, on real etcd and Kafka.

`start_server(settings)` runs uvicorn in a background thread of this process (its own
event loop), so tests talk to it over real HTTP with httpx exactly as a datanode does.
Each test gets its own etcd key prefix and Kafka topic prefix (`unique_prefix`); both
are cleaned up afterwards.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from api import create_app
from api.runtime import Runtime
from api.serving import uvicorn_config
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.settings import Settings, load_settings
from metasrv.sql import migrate_embedded
from tests._wait import wait_until
from toolbox.simulator import free_port
from toolbox.stack import S3Endpoint

NUM_TOPICS = 3


@dataclass
class Server:
    """A running metasrv."""

    settings: Settings
    app: FastAPI
    base_url: str
    addr: str

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30)


@contextlib.contextmanager
def start_server(
    settings: Settings,
    *,
    wait_serving: bool = True,
    token: str | None = None,
    timeout: float = 30.0,
    loop: str = "asyncio",
) -> Iterator[Server]:
    """Run the app under uvicorn in a thread until the block ends; with `wait_serving`,
    yield once `GET /v1/leader` (asked with `token`) says it leads and serves."""
    host, _, port = settings.http.addr.rpartition(":")
    app = create_app(settings)
    config = uvicorn_config(app, settings.http, host, int(port), loop=loop)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"metasrv-{port}", daemon=True)
    thread.start()
    handle = Server(settings, app, f"http://{settings.http.addr}", settings.http.addr)
    try:
        started = time.monotonic()
        wait_until(lambda: server.started or not thread.is_alive(), "uvicorn up", timeout=timeout)
        assert server.started, "metasrv did not start"
        if wait_serving:
            with handle.client(token) as client:
                wait_until(
                    lambda: client.get("/v1/leader").json().get("serving"),
                    "a serving leader",
                    timeout=max(0.0, timeout - (time.monotonic() - started)),
                    interval=0.05,
                )
        yield handle
    finally:
        server.should_exit = True
        thread.join(30)


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def make_settings(
    kafka_bootstrap: str, etcd_endpoint: str, unique_prefix: str, tmp_path: Any
) -> Iterator[SettingsFactory]:
    """Settings for a server on a fresh port; sections given as kwargs override."""

    def make(**sections: dict[str, Any]) -> Settings:
        base: dict[str, dict[str, Any]] = {
            "wal": {
                "broker_endpoints": [kafka_bootstrap],
                "num_topics": NUM_TOPICS,
                "topic_name_prefix": f"{unique_prefix}_wal",
                "checkpoint_interval": "200ms",
                "region_stat_ttl": "30s",
            },
            "http": {"addr": f"127.0.0.1:{free_port()}", "body_limit": "1MB"},
            "kv": {
                "backend": "etcd",
                "etcd_endpoints": [etcd_endpoint],
                "key_prefix": f"{unique_prefix}/",
            },
            "history": {"url": f"sqlite:///{tmp_path}/history.db"},
            "election": {"lease_secs": 2},
        }
        for name, values in sections.items():
            base.setdefault(name, {}).update(values)
        settings = load_settings(None, **base)
        migrate_embedded(settings.history.url)  # else /readyz is 503 (not migrated)
        return settings

    yield make
    kv = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
    kv.delete_prefix("")
    kv.close()
    kafka = KafkaAdmin(kafka_bootstrap)
    kafka.delete_topics(t for t in kafka.list_topics() if t.startswith(unique_prefix))


@pytest.fixture
def server(make_settings: SettingsFactory) -> Iterator[Server]:
    """A serving leader with no tokens configured (every endpoint open)."""
    with start_server(make_settings()) as srv:
        yield srv


@pytest.fixture
def archived_server(
    make_settings: SettingsFactory, s3_endpoint: S3Endpoint, s3_prefix: str
) -> Iterator[Server]:
    """`server` with the WAL archive enabled on the test's bucket prefix (DESIGN §8)."""
    from tests._archive import archive_config

    archive = archive_config(s3_endpoint, s3_prefix)
    with start_server(make_settings(wal={"archive": archive})) as srv:
        yield srv


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture
def etcd(etcd_endpoint: str, unique_prefix: str) -> Iterator[EtcdKv]:
    """Direct access to the test's etcd keys (as the server stores them)."""
    kv = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
    yield kv
    kv.close()


def region(
    region_id: int,
    topic: str,
    flushed: int,
    *,
    latest: int | None = None,
    memtable: int = 10,
    manifest: int | None = 1,
) -> dict[str, Any]:
    """One region entry of a heartbeat body."""
    return {
        "region_id": region_id,
        "topic": topic,
        "flushed_entry_id": flushed,
        "topic_latest_entry_id": latest,
        "memtable_bytes": memtable,
        "manifest_version": manifest,
    }


def heartbeat(
    node_id: int, regions: list[dict[str, Any]], topics: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A heartbeat body."""
    return {
        "node_id": node_id,
        "addr": f"dn{node_id}:4001",
        "regions": regions,
        "topics": topics or [],
    }


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is `status` with a DESIGN §5 error body; returns the error object."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str)
    if code is not None:
        assert error["code"] == code, error
    return error


def readyz_checks(response: httpx.Response) -> dict[str, str]:
    """The checks of a `/readyz` answer, ready (200) or not (503)."""
    body = response.json()
    checks: dict[str, str] = (
        body["checks"] if response.status_code == 200 else body["error"]["checks"]
    )
    return checks
