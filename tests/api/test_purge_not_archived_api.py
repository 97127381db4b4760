"""The purge's archive check through the served API (DESIGN §5, §8, invariant 10), on a real
metasrv, Kafka, etcd and the stack's S3 server: a purge the bucket does not cover ends
skipped, and the plan names the topic itself in `blocked_by` (`not_archived`), with why, and
`/metrics` has `metasrv_wal_archive_blocked{topic}` at 1, until a purge's check passes.

Also the named-topic views and a damaged marker: `GET /v1/topics/{topic}` and
`GET /v1/purge/plan?topic=` answer `damaged_marker` as `GET /v1/regions/{id}` does, while
the lists of every topic read it as absent (their documented policy).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from metasrv import keys
from metasrv.archive import ObjectStore
from metasrv.kv import EtcdKv
from tests._archive import archive_config, archive_settings, produce_records, put_archived
from tests._wait import wait_until
from tests.api._live import produce
from tests.api.conftest import SettingsFactory, assert_error, heartbeat, region, start_server
from toolbox.stack import S3Endpoint

CHROMIUM = "/usr/bin/chromium"
_TERMINAL = ("succeeded", "skipped", "failed", "cancelled")


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def _purge(client: httpx.Client, topic: str) -> dict[str, object]:
    answer = client.post("/v1/purge", json={"topics": [topic], "dry_run": False})
    assert answer.status_code == 202, answer.text
    [procedure_id] = answer.json()["procedure_ids"]

    def ended() -> dict[str, object] | None:
        view: dict[str, object] = client.get(f"/v1/procedures/{procedure_id}").json()
        return view if view["state"] in _TERMINAL else None

    return wait_until(ended, f"the purge of {topic} ends")


def _blocked_gauge(client: httpx.Client, topic: str) -> float | None:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    for family in text_string_to_metric_families(response.text):
        if family.name == "metasrv_wal_archive_blocked":
            for sample in family.samples:
                if sample.labels.get("topic") == topic:
                    return sample.value
    return None


@pytest.fixture
def store(s3_endpoint: S3Endpoint, s3_prefix: str) -> Iterator[ObjectStore]:
    client = ObjectStore(archive_settings(s3_endpoint, s3_prefix))
    yield client
    for obj in client.list(s3_prefix):
        client.delete(obj.key)
    client.close()


def _the_dashboard_names_the_archive(base_url: str, topic: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base_url}/dashboard")
            page.wait_for_selector("body[data-loaded=true]", timeout=15_000)
            row = page.locator(f'tr[data-topic="{topic}"]')
            expect(row.get_by_test_id("blocked-archive")).to_contain_text(
                "blocked by the WAL archive (not_archived): the bucket lacks entries [10, 15)"
            )
        finally:
            browser.close()


def test_a_purge_the_bucket_does_not_cover_is_named_in_the_plan(
    make_settings: SettingsFactory,
    kafka_bootstrap: str,
    unique_prefix: str,
    s3_endpoint: S3Endpoint,
    s3_prefix: str,
    store: ObjectStore,
) -> None:
    group = f"{unique_prefix}-archive"
    archive = archive_config(s3_endpoint, s3_prefix, consumer_group=group)
    topic = f"{unique_prefix}_wal_0"
    with start_server(make_settings(wal={"archive": archive})) as srv, srv.client() as client:
        answer = client.post("/v1/regions", json={"region_id": 1, "node_id": 1, "topic": topic})
        assert answer.status_code == 201, answer.text
        records = produce_records(kafka_bootstrap, topic, 30)
        assert (
            client.post("/v1/heartbeat", json=heartbeat(1, [region(1, topic, 19)])).status_code
            == 200
        )
        _commit(kafka_bootstrap, group, topic, 25)  # the pin lets P = 19 through
        put_archived(store, topic, records[0:10])
        put_archived(store, topic, records[15:25])  # 10..14 in no object

        view = _purge(client, topic)

        assert view["state"] == "skipped", view
        assert "lacks entries [10, 15) of [0, 19)" in str(view["outcome"])
        [plan] = client.get("/v1/purge/plan", params={"topic": topic}).json()["topics"]
        assert plan["blocked_by"] == [{"topic": topic, "reason": "not_archived"}]
        assert "[10, 15)" in plan["not_archived"]
        assert plan["prune_point"] == 19  # the next purge tries again
        assert plan["log_start_offset"] == 0
        shown = client.get(f"/v1/topics/{topic}").json()
        assert shown["blocked_by"] == plan["blocked_by"]
        assert _blocked_gauge(client, topic) == 1.0
        if shutil.which(CHROMIUM) is not None:
            _the_dashboard_names_the_archive(srv.base_url, topic)

        put_archived(store, topic, records[10:15])
        view = _purge(client, topic)

        assert view["state"] == "succeeded", view
        [plan] = client.get("/v1/purge/plan", params={"topic": topic}).json()["topics"]
        assert plan["blocked_by"] == [] and plan["not_archived"] is None
        assert plan["log_start_offset"] == 19
        assert _blocked_gauge(client, topic) == 0.0


def test_a_named_topic_with_a_damaged_marker_answers_damaged_marker(
    client: httpx.Client, etcd: EtcdKv, kafka_bootstrap: str
) -> None:
    topic = client.post("/v1/regions", json={"region_id": 8, "node_id": 1}).json()["topic"]
    produce(kafka_bootstrap, topic, 60)
    client.post("/v1/heartbeat", json=heartbeat(1, [region(8, topic, 30)]))
    # Read as "never purged", the plan showed P = 30 from a marker nobody can read.
    etcd.put(keys.topic_name(topic), b'{"pruned_entry_id": "fifty"}')

    error = assert_error(client.get(f"/v1/topics/{topic}"), 500, "damaged_marker")
    assert error["topic"] == topic
    error = assert_error(
        client.get("/v1/purge/plan", params={"topic": topic}), 500, "damaged_marker"
    )
    assert error["topic"] == topic
    dry = client.post("/v1/purge", json={"topics": [topic], "dry_run": True})
    assert_error(dry, 500, "damaged_marker")
    # The lists of every topic keep their policy: a damaged marker reads as absent.
    listed = {t["topic"]: t for t in client.get("/v1/topics").json()["topics"]}
    assert listed[topic]["pruned_entry_id"] is None
    plans = {p["topic"]: p for p in client.get("/v1/purge/plan").json()["topics"]}
    assert plans[topic]["pruned_entry_id"] is None

    etcd.put(keys.topic_name(topic), b'{"pruned_entry_id": 20}')
    assert client.get(f"/v1/topics/{topic}").json()["pruned_entry_id"] == 20
    [plan] = client.get("/v1/purge/plan", params={"topic": topic}).json()["topics"]
    assert plan["pruned_entry_id"] == 20
