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

from metasrv.archive import ObjectStore
from tests._archive import archive_config, put_archived
from tests._wait import wait_until
from tests.api._archive import losing_region, purge_to_end
from tests.api.conftest import Server, SettingsFactory, start_server
from toolbox.simulator import free_port
from toolbox.stack import S3Endpoint

FLUSHED = 5
LOG_START = 20


def _loss_event(client: httpx.Client, topic: str) -> dict[str, Any]:
    """Purge `topic`, wait for the purge to end and its data-loss event; return the event."""
    view = purge_to_end(client, topic)
    assert (view["state"], view["error_code"]) == ("failed", "wal_data_loss"), view

    def events() -> list[dict[str, Any]]:
        params = {"topic": topic, "kind": "wal_data_loss"}
        found: list[dict[str, Any]] = client.get("/v1/events", params=params).json()["events"]
        return found

    wait_until(lambda: events(), f"the data-loss event of {topic}")
    [event] = events()
    return event


def test_the_loss_event_says_whether_the_archive_holds_the_lost_entries(
    archived_server: Server, kafka_bootstrap: str, unique_prefix: str, archive_store: ObjectStore
) -> None:
    held, gap = f"{unique_prefix}_wal_0", f"{unique_prefix}_wal_1"
    with archived_server.client() as client:
        records = losing_region(
            client, kafka_bootstrap, 1, held, flushed=FLUSHED, log_start=LOG_START
        )
        put_archived(archive_store, held, records[0:12])
        put_archived(archive_store, held, records[10:20])
        records = losing_region(
            client, kafka_bootstrap, 2, gap, flushed=FLUSHED, log_start=LOG_START
        )
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
        losing_region(client, kafka_bootstrap, 1, topic, flushed=FLUSHED, log_start=LOG_START)
        event = _loss_event(client, topic)
        assert event["details"]["archive_covers"] is None
        assert "archive" not in event["message"]
