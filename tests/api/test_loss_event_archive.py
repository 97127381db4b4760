"""A `wal_data_loss` event says whether the WAL archive holds what Kafka lost (DESIGN §8),
over real HTTP on real etcd, Kafka and the stack's S3-compatible server.

A region reports flushed entry 5, so it needs entries from 6 on; an out-of-band DeleteRecords
trims its topic to 20. The purge the operator asks for finds the loss (invariant 7) and
records one event per region, with `details.archive_covers`: true when the archive's objects
hold [6, 20), false when they have a gap there, null when the archive is disabled or its store
(a closed port here) does not answer.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from metasrv.archive import ObjectStore, WalRecord
from tests._archive import archive_config, produce_records, put_archived, trim
from tests._wait import wait_until
from tests.api.conftest import SettingsFactory, heartbeat, region, start_server
from toolbox.simulator import free_port
from toolbox.stack import S3Endpoint

FLUSHED = 5
LOG_START = 20
_TERMINAL = ("succeeded", "skipped", "failed", "cancelled")


def _losing_region(
    client: httpx.Client, kafka_bootstrap: str, region_id: int, topic: str
) -> list[WalRecord]:
    """Region `region_id` on `topic`, needing entries from `FLUSHED + 1` that a trim to
    `LOG_START` deleted; returns the records produced."""
    answer = client.post("/v1/regions", json={"region_id": region_id, "node_id": 1, "topic": topic})
    assert answer.status_code == 201, answer.text
    records = produce_records(kafka_bootstrap, topic, 30)
    answer = client.post("/v1/heartbeat", json=heartbeat(1, [region(region_id, topic, FLUSHED)]))
    assert answer.status_code == 200 and not answer.json()["rejected"], answer.text
    assert trim(kafka_bootstrap, topic, LOG_START) == LOG_START
    return records


def _loss_event(client: httpx.Client, topic: str) -> dict[str, Any]:
    """Purge `topic`, wait for the purge to end and its data-loss event; return the event."""
    answer = client.post("/v1/purge", json={"topics": [topic], "dry_run": False})
    assert answer.status_code == 202, answer.text
    [procedure_id] = answer.json()["procedure_ids"]

    def failed() -> bool:
        state = client.get(f"/v1/procedures/{procedure_id}").json()["state"]
        return state in _TERMINAL

    wait_until(failed, f"the purge of {topic} ends")
    view = client.get(f"/v1/procedures/{procedure_id}").json()
    assert (view["state"], view["error_code"]) == ("failed", "wal_data_loss"), view

    def events() -> list[dict[str, Any]]:
        params = {"topic": topic, "kind": "wal_data_loss"}
        found: list[dict[str, Any]] = client.get("/v1/events", params=params).json()["events"]
        return found

    wait_until(lambda: events(), f"the data-loss event of {topic}")
    [event] = events()
    return event


def test_the_loss_event_says_whether_the_archive_holds_the_lost_entries(
    make_settings: SettingsFactory,
    kafka_bootstrap: str,
    unique_prefix: str,
    s3_endpoint: S3Endpoint,
    s3_prefix: str,
    archive_store: ObjectStore,
) -> None:
    settings = make_settings(wal={"archive": archive_config(s3_endpoint, s3_prefix)})
    held, gap = f"{unique_prefix}_wal_0", f"{unique_prefix}_wal_1"
    with start_server(settings) as srv, srv.client() as client:
        records = _losing_region(client, kafka_bootstrap, 1, held)
        put_archived(archive_store, held, records[0:12])
        put_archived(archive_store, held, records[10:20])
        records = _losing_region(client, kafka_bootstrap, 2, gap)
        put_archived(archive_store, gap, records[0:15])  # 15..19 are in no object

        event = _loss_event(client, held)
        assert event["region_id"] == 1
        assert event["details"]["archive_covers"] is True
        assert "the WAL archive holds them" in event["message"]
        event = _loss_event(client, gap)
        assert event["region_id"] == 2
        assert event["details"]["archive_covers"] is False


@pytest.mark.parametrize("archive", ["disabled", "store_down"])
def test_the_loss_event_says_null_without_an_archive_to_ask(
    make_settings: SettingsFactory,
    kafka_bootstrap: str,
    unique_prefix: str,
    s3_endpoint: S3Endpoint,
    s3_prefix: str,
    archive: str,
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    config = archive_config(
        s3_endpoint, s3_prefix, enabled=archive == "store_down", endpoint=closed
    )
    topic = f"{unique_prefix}_wal_0"
    with start_server(make_settings(wal={"archive": config})) as srv, srv.client() as client:
        _losing_region(client, kafka_bootstrap, 1, topic)
        event = _loss_event(client, topic)
        assert event["details"]["archive_covers"] is None
        assert "archive" not in event["message"]
