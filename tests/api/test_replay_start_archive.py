"""Replay-start names the WAL archive's objects, and a region replays through them (DESIGN §5,
§8 "Restore"), over real HTTP on real etcd, Kafka and the stack's S3-compatible server.

Each test produces records to the region's topic, archives some of them with `ObjectStore`
directly, and trims the topic past the region's need with an out-of-band DeleteRecords (as
retention or an operator would). A store that cannot answer is a closed port on loopback:
a replay start that does not need the archive answers all the same, which shows it never
asked the store.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import httpx
import pytest

from metasrv.archive import ObjectStore, WalRecord
from metasrv.datanode import DatanodeClient, WalEntry, replay_region
from metasrv.errors import WalDataLoss
from tests._archive import (
    archive_config,
    produce_records,
    put_archived,
    trim,
)
from tests.api.conftest import Server, SettingsFactory, assert_error, start_server
from toolbox.simulator import free_port
from toolbox.stack import S3Endpoint

REGION = 1
RECORDS = 40
LOG_START = 30


def _archived_server(
    make_settings: SettingsFactory, archive: dict[str, object]
) -> AbstractContextManager[Server]:
    return start_server(make_settings(wal={"archive": archive}))


def _region_topic(client: httpx.Client) -> str:
    answer = client.post("/v1/regions", json={"region_id": REGION, "node_id": 1})
    assert answer.status_code == 201, answer.text
    topic: str = answer.json()["topic"]
    return topic


def _trimmed_topic(client: httpx.Client, kafka_bootstrap: str) -> tuple[str, list[WalRecord]]:
    """The region's topic with `RECORDS` records, of which Kafka keeps those from
    `LOG_START` on; the region has never reported, so it replays from entry 0."""
    topic = _region_topic(client)
    records = produce_records(kafka_bootstrap, topic, RECORDS)
    assert [r.entry_id for r in records] == list(range(RECORDS))
    assert trim(kafka_bootstrap, topic, LOG_START) == LOG_START
    return topic, records


def _entries(records: list[WalRecord]) -> list[WalEntry]:
    return [WalEntry(r.entry_id, r.key, r.value) for r in records]


def test_replay_start_lists_the_covering_objects_and_the_replay_returns_every_entry_once(
    archived_server: Server,
    kafka_bootstrap: str,
    archive_store: ObjectStore,
    s3_endpoint: S3Endpoint,
    s3_prefix: str,
) -> None:
    with archived_server.client() as client:
        topic, records = _trimmed_topic(client, kafka_bootstrap)
        # Overlapping ranges (an archiver killed before its commit archives one again),
        # and an object above the log start that the replay needs none of.
        keys = [
            put_archived(archive_store, topic, records[0:15]),
            put_archived(archive_store, topic, records[10:25]),
            put_archived(archive_store, topic, records[25:30]),
            put_archived(archive_store, topic, records[30:35]),
        ]
        archive_store.put(f"{s3_prefix}{topic}/not-an-archive-object.txt", b"skipped")
        answer = client.get(f"/v1/regions/{REGION}/replay-start")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "region_id": REGION,
            "topic": topic,
            "start_entry_id": 0,
            "log_start_offset": LOG_START,
            "archive": [
                {
                    "bucket": s3_endpoint.bucket,
                    "key": key,
                    "first_entry_id": first,
                    "last_entry_id": last,
                }
                for key, (first, last) in zip(keys, [(0, 14), (10, 24), (25, 29)], strict=False)
            ],
        }
    with DatanodeClient(archived_server.addr) as datanode:
        replayed = list(replay_region(datanode, REGION, kafka=kafka_bootstrap, store=archive_store))
        assert replayed == _entries(records)
        # The region's own flushed id is above metasrv's start: replay from it + 1.
        again = replay_region(
            datanode, REGION, kafka=kafka_bootstrap, store=archive_store, flushed_entry_id=12
        )
        assert list(again) == _entries(records[13:])


def test_a_gap_in_the_archive_answers_no_archive_and_the_replay_reports_data_loss(
    archived_server: Server, kafka_bootstrap: str, archive_store: ObjectStore
) -> None:
    with archived_server.client() as client:
        topic, records = _trimmed_topic(client, kafka_bootstrap)
        put_archived(archive_store, topic, records[0:15])
        put_archived(archive_store, topic, records[20:30])  # 15..19 are in no object
        answer = client.get(f"/v1/regions/{REGION}/replay-start").json()
        assert (answer["log_start_offset"], answer["archive"]) == (LOG_START, None)
    with (
        DatanodeClient(archived_server.addr) as datanode,
        pytest.raises(WalDataLoss, match="not hold"),
    ):
        list(replay_region(datanode, REGION, kafka=kafka_bootstrap, store=archive_store))


def test_an_unreachable_store_is_503_only_when_the_archive_is_needed(
    make_settings: SettingsFactory, kafka_bootstrap: str, s3_endpoint: S3Endpoint, s3_prefix: str
) -> None:
    closed = archive_config(s3_endpoint, s3_prefix, endpoint=f"http://127.0.0.1:{free_port()}")
    with _archived_server(make_settings, closed) as srv, srv.client() as client:
        topic = _region_topic(client)
        produce_records(kafka_bootstrap, topic, 10)
        # At or above the log start: answered without asking the store.
        answer = client.get(f"/v1/regions/{REGION}/replay-start")
        assert answer.status_code == 200, answer.text
        assert answer.json()["log_start_offset"] == 0
        assert answer.json()["archive"] is None
        assert trim(kafka_bootstrap, topic, 5) == 5
        error = assert_error(
            client.get(f"/v1/regions/{REGION}/replay-start"), 503, "object_store_unavailable"
        )
        assert "object store" in error["message"]


def test_archive_disabled_answers_the_log_start_and_no_archive_without_the_store(
    make_settings: SettingsFactory, kafka_bootstrap: str, s3_endpoint: S3Endpoint, s3_prefix: str
) -> None:
    # Disabled, and pointing at a closed port: any store call would fail the request.
    off = archive_config(
        s3_endpoint, s3_prefix, enabled=False, endpoint=f"http://127.0.0.1:{free_port()}"
    )
    with _archived_server(make_settings, off) as srv, srv.client() as client:
        _trimmed_topic(client, kafka_bootstrap)
        answer = client.get(f"/v1/regions/{REGION}/replay-start")
        assert answer.status_code == 200, answer.text
        assert answer.json()["start_entry_id"] == 0
        assert answer.json()["log_start_offset"] == LOG_START
        assert answer.json()["archive"] is None
