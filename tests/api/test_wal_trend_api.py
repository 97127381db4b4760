"""`GET /v1/purge/trend` on a live metasrv (etcd, Kafka, SQLite history) sampling every
200 ms: retained WAL per topic from Kafka's offsets, the purge that cut it, the viewer
token, bad input and the OpenAPI document."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metasrv import wire
from tests._wait import wait_until
from tests.api._live import RECORD_BYTES, RECORDS_PER_TOPIC, VIEWER_TOKEN, World, live_metasrv
from tests.api._live import purge_and_wait as purge_over_rest


@pytest.fixture(scope="module")
def served(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, World]]:
    # A 10-minute window: on a loaded machine the purge below may be a minute old by the time
    # the test reads the trend, and must still be in it.
    workdir = tmp_path_factory.mktemp("trend")
    fast = {"sample_interval": "200ms", "window": "10m"}
    with live_metasrv(kafka_bootstrap, etcd_endpoint, workdir, dashboard=fast) as metasrv:
        views = purge_over_rest(metasrv.url, [metasrv.world.purgeable_topic])
        assert [v.state for v in views] == ["succeeded"]
        yield metasrv.url, metasrv.world


@pytest.fixture
def viewer(served: tuple[str, World]) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    with httpx.Client(base_url=served[0], headers=headers, timeout=10) as client:
        yield client


def trend(client: httpx.Client, **params: str | int) -> wire.WalTrend:
    response = client.get("/v1/purge/trend", params=params)
    assert response.status_code == 200, response.text
    return wire.decode(response.content, wire.WalTrend)


def newest(body: wire.WalTrend, topic: str) -> tuple[int | None, int | None]:
    (series,) = [s for s in body.topics if s.topic == topic]
    return series.entries[-1], series.bytes[-1]


def test_trend_shows_retained_wal_and_the_purge(
    served: tuple[str, World], viewer: httpx.Client
) -> None:
    _, w = served

    # Samples taken after the purge: the purged topic keeps high watermark - prune point.
    # Kafka's log start moves before the purge's history row is written, so a sample can
    # show the cut one round before the purge mark is read in: wait for both.
    def after_the_purge() -> wire.WalTrend | None:
        body = trend(viewer)
        purged = newest(body, w.purgeable_topic)[0] == RECORDS_PER_TOPIC - 9
        return body if len(body.at) >= 3 and purged and body.purges else None

    body = wait_until(after_the_purge, "samples after the purge", timeout=15, interval=0.2)
    assert body.sample_interval_s == 0.2 and body.window_s == 600
    assert list(body.at) == sorted(body.at) and body.at[-1] <= time.time()
    assert body.topic_count == 3
    # Datanodes reported 100-byte records for the purgeable and the loss topics only.
    assert newest(body, w.purgeable_topic) == (11, 11 * RECORD_BYTES)
    assert newest(body, w.loss_topic) == (10, 10 * RECORD_BYTES)  # log start 10 (outside cut)
    assert newest(body, w.blocked_topic) == (RECORDS_PER_TOPIC, None)
    assert body.total_entries[-1] == 11 + 10 + RECORDS_PER_TOPIC
    assert body.total_bytes[-1] == 21 * RECORD_BYTES
    (purge,) = body.purges
    assert (purge.topic, purge.prune_point, purge.entries_deleted) == (w.purgeable_topic, 9, 9)
    assert purge.bytes_estimated == 9 * RECORD_BYTES
    history = viewer.get("/v1/purge/history").json()["purges"]
    assert purge.procedure_id == history[0]["procedure_id"]

    assert [s.topic for s in trend(viewer, top=2).topics] == [w.purgeable_topic, w.loss_topic]
    only = trend(viewer, topic=w.blocked_topic)
    assert [s.topic for s in only.topics] == [w.blocked_topic]
    assert len(only.topics[0].entries) == len(only.at)
    assert len(only.purges) == 1  # purges of every topic: the page marks them all


def test_trend_needs_a_viewer_token_and_checks_its_query(
    served: tuple[str, World], viewer: httpx.Client
) -> None:
    url, _ = served
    assert httpx.get(f"{url}/v1/purge/trend").status_code == 401
    assert viewer.get("/v1/purge/trend", params={"top": 0}).status_code == 422
    assert viewer.get("/v1/purge/trend", params={"top": "x"}).status_code == 422
    assert viewer.get("/v1/purge/trend", params={"topic": "bad topic!"}).status_code == 422
    assert trend(viewer, topic="never_sampled").topics == []


def test_openapi_names_the_trend_body(viewer: httpx.Client) -> None:
    doc = viewer.get("/openapi.json").json()
    op = doc["paths"]["/v1/purge/trend"]["get"]
    ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/WalTrend")
    schema = doc["components"]["schemas"]["WalTrend"]
    assert {"at", "topics", "purges", "total_entries", "total_bytes"} <= set(schema["required"])
    assert "TrendPurge" in doc["components"]["schemas"]


def test_trend_is_empty_when_sampling_is_off(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path: Path
) -> None:
    off = {"sample_interval": "0s"}
    with live_metasrv(kafka_bootstrap, etcd_endpoint, tmp_path, dashboard=off) as metasrv:
        # Seeded: it has led, registered, heartbeaten and purged; a sampler would have run.
        headers = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
        with httpx.Client(base_url=metasrv.url, headers=headers) as client:
            body = trend(client)
    assert body.sample_interval_s == 0 and body.at == [] and body.topics == []
