"""`GET /v1/purge/archived`: each topic's archived range as the leader's last listing of the WAL
archive found it (DESIGN §8), over real HTTP on real etcd, Kafka and the stack's S3 server.

The listing is the purge's own (`procedures.wal_purge.archived_ranges`): here a purge that
finds WAL data loss lists the topic to say whether the archive holds the loss, and the answer
shows that listing until the next one; a page view never calls the store.
"""

from __future__ import annotations

import shutil

import httpx
import pytest

from metasrv.archive import ArchivedRange, ObjectStore, WalRecord
from procedures.wal_purge import ArchivedSpan
from tests._archive import put_archived
from tests.api._archive import losing_region, purge_to_end
from tests.api.conftest import Server, SettingsFactory, start_server

CHROMIUM = "/usr/bin/chromium"


def test_a_span_is_the_gapless_run_from_the_lowest_entry() -> None:
    def span(*ranges: tuple[int, int]) -> tuple[int | None, int | None, bool, int]:
        found = ArchivedSpan.of([ArchivedRange("t", a, b) for a, b in ranges], 1.0)
        return found.first_entry_id, found.end, found.gap, found.objects

    assert span() == (None, None, False, 0)
    assert span((10, 19), (0, 11), (20, 20)) == (0, 21, False, 3)
    assert span((0, 9), (12, 15)) == (0, 10, True, 2)


def _lost_and_archived(
    store: ObjectStore, kafka_bootstrap: str, client: httpx.Client, topic: str
) -> list[WalRecord]:
    """Region 1 on `topic` needs entries from 6; 30 records, archived as [0, 11], [10, 19]
    and [25, 29] (20..24 in no object); Kafka trimmed to 20. Returns the records."""
    records = losing_region(client, kafka_bootstrap, 1, topic)
    put_archived(store, topic, records[0:12])
    put_archived(store, topic, records[10:20])
    put_archived(store, topic, records[25:30])
    return records


def test_the_answer_is_the_last_listing_a_purge_made(
    archived_server: Server, kafka_bootstrap: str, unique_prefix: str, archive_store: ObjectStore
) -> None:
    topic = f"{unique_prefix}_wal_0"
    with archived_server.client() as client:
        assert client.get("/v1/purge/archived").json() == {"enabled": True, "topics": []}
        records = _lost_and_archived(archive_store, kafka_bootstrap, client, topic)
        purge_to_end(client, topic)  # WAL data loss: the purge lists the archive
        first = client.get("/v1/purge/archived").json()
        [shown] = first["topics"]
        assert shown["topic"] == topic
        assert (shown["first_entry_id"], shown["end"], shown["gap"]) == (0, 20, True)
        assert shown["objects"] == 3
        # A new object is not seen until a purge lists again: no store call per view.
        put_archived(archive_store, topic, records[20:25])
        assert client.get("/v1/purge/archived").json() == first
        purge_to_end(client, topic)
        [shown] = client.get("/v1/purge/archived").json()["topics"]
        assert (shown["first_entry_id"], shown["end"], shown["gap"]) == (0, 30, False)
        assert shown["listed_at"] > first["topics"][0]["listed_at"]


@pytest.mark.browser
@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} is absent")
def test_the_dashboard_shows_the_archived_range_beside_the_log_start(
    archived_server: Server, kafka_bootstrap: str, unique_prefix: str, archive_store: ObjectStore
) -> None:
    from playwright.sync_api import expect, sync_playwright

    topic, other = f"{unique_prefix}_wal_0", f"{unique_prefix}_wal_1"
    with archived_server.client() as client:
        _lost_and_archived(archive_store, kafka_bootstrap, client, topic)
        purge_to_end(client, topic)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{archived_server.base_url}/dashboard")
                page.wait_for_selector("body[data-loaded=true]", timeout=15_000)
                row = page.locator(f'tr[data-topic="{topic}"]')
                expect(row.locator('[data-field="log_start_offset"]')).to_have_text("20")
                expect(row.locator('[data-field="archived"]')).to_have_text("0…19 (gap after)")
                unlisted = page.locator(f'tr[data-topic="{other}"] [data-field="archived"]')
                expect(unlisted).to_have_text("not listed")
            finally:
                browser.close()


def test_with_the_archive_off_nothing_is_shown(make_settings: SettingsFactory) -> None:
    with start_server(make_settings()) as srv, srv.client() as client:
        answer = client.get("/v1/purge/archived")
        assert answer.status_code == 200
        assert answer.json() == {"enabled": False, "topics": []}
