"""A follower is ready when it can take over warm: `/readyz` on a follower is 503, with a
`follower_map` check saying how far its full load of the topic-region map is, until the map
is loaded and follows the kv; then 200. The leader's readiness has no such check.

Real servers (uvicorn in threads of this process) on one real etcd prefix or one migrated
PostgreSQL schema, with a map of `ROUTES` routes written straight into the kv, large enough
that the follower's full load spans many of its `/readyz` answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import migrations
from metasrv import keys
from metasrv.kv import EtcdKv, KvBackend, SqlKv
from metasrv.settings import Settings
from tests._wait import wait_until
from tests.api.conftest import NUM_TOPICS, SettingsFactory, readyz_checks, start_server
from tests.metasrv.kv._pgschema import fresh_schema
from toolbox.simulator import free_port

ROUTES = 100_000
"""Routes in the map: a full load of this many takes over a second on both stores."""

LOADING = re.compile(r"loading: (\d+) routes read")


@pytest.fixture(params=["etcd", "postgresql"])
def store(
    request: pytest.FixtureRequest, etcd_endpoint: str, unique_prefix: str
) -> Iterator[tuple[dict[str, Any], KvBackend]]:
    """The `[kv]` section both servers share and a client of the same keys."""
    if request.param == "postgresql":
        with fresh_schema(request.getfixturevalue("postgres_url")) as url:
            migrations.upgrade(url)
            kv: KvBackend = SqlKv(url, f"{unique_prefix}/")
            yield {"backend": "sql", "sql_url": url}, kv
            kv.close()
        return
    kv = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
    yield {}, kv  # make_settings' own etcd prefix, cleaned up by it
    kv.close()


def seed_routes(kv: KvBackend, topic_prefix: str, count: int) -> None:
    route = keys.encode_route(1, None)
    items = [
        (keys.topic_region(f"{topic_prefix}_{n % NUM_TOPICS}", (1024 << 32) | n), route)
        for n in range(count)
    ]
    kv.batch_put(items)


def follower_settings(leader: Settings) -> Settings:
    return leader.model_copy(
        update={"http": leader.http.model_copy(update={"addr": f"127.0.0.1:{free_port()}"})}
    )


def test_a_follower_is_ready_once_its_map_is_loaded_and_followed(
    make_settings: SettingsFactory, store: tuple[dict[str, Any], KvBackend]
) -> None:
    kv_section, kv = store
    settings = make_settings(kv=kv_section) if kv_section else make_settings()
    seed_routes(kv, settings.wal.topic_name_prefix, ROUTES)
    with start_server(settings) as leader:
        with leader.client() as c:
            resp = c.get("/readyz")
            assert resp.status_code == 200, resp.text
            assert resp.json()["is_leader"] is True
            assert "follower_map" not in resp.json()["checks"]  # the leader's is unchanged
        with start_server(follower_settings(settings), wait_serving=False) as follower:
            answers: list[httpx.Response] = []
            with follower.client() as c:

                def answered_ready() -> bool:  # every answer kept: the 503s are read too
                    answers.append(c.get("/readyz"))
                    return answers[-1].status_code == 200

                wait_until(answered_ready, "the follower ready", timeout=120)
            ready = answers[-1]
            not_ready = answers[:-1]
            assert ready.json() == {
                "status": "ready",
                "checks": {
                    "kv": "ok",
                    "kafka": "ok",
                    "history": "ok",
                    "background_tasks": "ok",
                    "follower_map": "ok",
                },
                "is_leader": False,
            }
            assert follower.runtime.follower is not None and follower.runtime.follower.warm
            assert len(follower.runtime.follower.region_map) == ROUTES
            # Its full load was seen, answered 503 naming how far it was, and counted up.
            loading = [readyz_checks(r)["follower_map"] for r in not_ready]
            assert loading, "no /readyz answer came while the follower loaded"
            assert all(r.status_code == 503 for r in not_ready)
            assert all(r.headers["Retry-After"] == "1" for r in not_ready)
            counts = [int(m.group(1)) for m in map(LOADING.fullmatch, loading) if m]
            assert len(counts) == len(loading), [s for s in loading if not LOADING.fullmatch(s)]
            assert counts == sorted(counts) and counts[-1] <= ROUTES, counts
            message = not_ready[-1].json()["error"]["message"]
            assert "follower_map: loading: " in message
        with leader.client() as c:  # the leader stayed ready throughout
            assert c.get("/readyz").status_code == 200
